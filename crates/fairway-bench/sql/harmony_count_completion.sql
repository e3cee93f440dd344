UPDATE harmony_user_work
   SET running_count = running_count - 1
 WHERE job_id = $1 AND service_id = $2;
