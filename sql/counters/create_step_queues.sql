-- create_step_queues: makes sure a job's step has a user_work row for each of the components,
-- and its user a service_users row and an actor_queues row per actor path prefix for each, so
-- that counter changes only ever update rows. The caller holds the user's users row, so the copied counters
-- and policy are current. A new row's ready_from is the greatest item id yet: the step's items,
-- inserted after it, come later, and a claim's first read of them then starts there rather than
-- at the first item of the table, which a plan that walks the primary key would read through.
--
-- Arguments: the job, the step, and the components (sorted, distinct). Answer: none.
-- Locks: the rows it inserts; the caller holds the user's users row.

CREATE OR REPLACE FUNCTION create_step_queues(p_job uuid, p_step integer, p_components text[])
RETURNS void
LANGUAGE plpgsql
AS $queues$
BEGIN
    WITH step AS (
        SELECT j.job_id, s.step_index, s.service, j.username, j.is_async, j.priority, j.tenant,
               j.actor,
               j.status = 'paused' AS paused,
               EXISTS (SELECT 1 FROM job_metadata m WHERE m.job_id = j.job_id) AS has_metadata
          FROM jobs j
          JOIN job_steps s ON s.job_id = j.job_id
         WHERE j.job_id = p_job
           AND s.step_index = p_step
    ), step_rows AS (
        INSERT INTO user_work (job_id, step_index, component, username, service, is_async, priority,
                               tenant, actor, paused, has_metadata, ready_from)
        SELECT step.job_id, step.step_index, c.component, step.username, step.service,
               step.is_async, step.priority, step.tenant, step.actor, step.paused, step.has_metadata,
               (SELECT coalesce(max(wi.id), 0) FROM work_items wi)
          FROM step, unnest(p_components) AS c(component)
            ON CONFLICT (job_id, step_index, component) DO NOTHING
    ), actor_rows AS (
        INSERT INTO actor_queues (service, component, tenant, username, path, parent)
        SELECT step.service, c.component, step.tenant, step.username, step.actor[1:depth],
               step.actor[1:depth - 1]
          FROM step, unnest(p_components) AS c(component),
               generate_series(1, cardinality(step.actor)) AS depth
            ON CONFLICT (username, service, component, tenant, path) DO NOTHING
    )
    INSERT INTO service_users (service, component, tenant, username, running_count, last_worked,
                               weight, max_running, throttled, tier)
    SELECT step.service, c.component, step.tenant, u.username, u.running_count, u.last_worked,
           u.weight, u.max_running, u.throttled_until IS NOT NULL, u.tier
      FROM step
      JOIN users u ON u.username = step.username,
           unnest(p_components) AS c(component)
        ON CONFLICT (username, service, component, tenant) DO NOTHING;
END;
$queues$;
