SELECT step_index, service, aggregate, ready_count, running_count,
       successful_count, failed_count, canceled_count
  FROM user_work
 WHERE job_id = $1
 ORDER BY step_index;
