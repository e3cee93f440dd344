-- Makes sure job $1's step $2 has a user_work row for each component in $3, and its user a
-- service_users row for each, so that counter changes only ever update rows. The caller holds
-- the user's users row, so the copied counters are current.
WITH step AS (
    SELECT j.job_id, s.step_index, s.service, j.username, j.is_async, j.tenant, j.actor,
           j.status = 'paused' AS paused
      FROM jobs j
      JOIN job_steps s ON s.job_id = j.job_id
     WHERE j.job_id = $1
       AND s.step_index = $2
), step_rows AS (
    INSERT INTO user_work (job_id, step_index, component, username, service, is_async, tenant,
                           actor, paused)
    SELECT step.job_id, step.step_index, c.component, step.username, step.service,
           step.is_async, step.tenant, step.actor, step.paused
      FROM step, unnest($3::text[]) AS c(component)
        ON CONFLICT (job_id, step_index, component) DO NOTHING
)
INSERT INTO service_users (service, component, tenant, username, running_count, last_worked)
SELECT step.service, c.component, step.tenant, u.username, u.running_count, u.last_worked
  FROM step
  JOIN users u ON u.username = step.username,
       unnest($3::text[]) AS c(component)
    ON CONFLICT (username, service, component, tenant) DO NOTHING;
