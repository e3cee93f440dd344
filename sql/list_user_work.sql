-- The user_work table for operators, optionally filtered by service $1 and user $2.
SELECT username, tenant, actor, job_id, step_index, service, component, is_async, paused,
       ready_count, running_count, last_worked
  FROM user_work
 WHERE ($1::text IS NULL OR service = $1)
   AND ($2::text IS NULL OR username = $2)
 ORDER BY username, service, job_id, step_index, component
 LIMIT $3;
