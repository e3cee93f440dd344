-- Job $1's steps with their item counts summed over components.
SELECT s.step_index,
       s.service,
       s.aggregate,
       coalesce(array_agg(uw.component ORDER BY uw.component)
                    FILTER (WHERE uw.component IS NOT NULL), '{}') AS components,
       coalesce(sum(uw.ready_count), 0)::integer AS ready_count,
       coalesce(sum(uw.running_count), 0)::integer AS running_count,
       coalesce(sum(uw.successful_count), 0)::integer AS successful_count,
       coalesce(sum(uw.failed_count), 0)::integer AS failed_count,
       coalesce(sum(uw.canceled_count), 0)::integer AS canceled_count
  FROM job_steps s
  LEFT JOIN user_work uw ON uw.job_id = s.job_id AND uw.step_index = s.step_index
 WHERE s.job_id = $1
 GROUP BY s.step_index, s.service, s.aggregate
 ORDER BY s.step_index;
