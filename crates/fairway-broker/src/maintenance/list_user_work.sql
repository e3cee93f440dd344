-- The user_work table for operators, optionally filtered by service $1 and user $2, $3 rows
-- from after the row keyed ($4, $5, $6, $7, $8) (NULL: from the start), in the order of
-- user_work_by_user, so that a page reads no more of the index than it lists.
SELECT username, tenant, actor, job_id, step_index, service, component, is_async, paused,
       ready_count, running_count, last_worked
  FROM user_work
 WHERE ($1::text IS NULL OR service = $1)
   AND ($2::text IS NULL OR username = $2)
   AND ($4::text IS NULL
        OR (username, service, job_id, step_index, component)
           > ($4::text, $5::text, $6::uuid, $7::integer, $8::text))
 ORDER BY username, service, job_id, step_index, component
 LIMIT $3;
