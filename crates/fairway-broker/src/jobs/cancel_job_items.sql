-- Cancels every ready, scheduled or running item of job $1. Returns, per step and component,
-- how many ready, scheduled and running items were canceled, for the counters.
WITH doomed AS (
    SELECT id, step_index, component, status
      FROM work_items
     WHERE job_id = $1
       -- Spelled as OR so that each arm can use its own partial index.
       AND (status = 'ready' OR status = 'running' OR status = 'scheduled')
       FOR NO KEY UPDATE
), canceled AS (
    UPDATE work_items wi
       SET status = 'canceled', lease_expires_at = NULL, not_before = NULL, updated_at = now()
      FROM doomed
     WHERE wi.id = doomed.id
)
SELECT step_index,
       component,
       (count(*) FILTER (WHERE status = 'ready'))::integer AS ready,
       (count(*) FILTER (WHERE status = 'scheduled'))::integer AS scheduled,
       (count(*) FILTER (WHERE status = 'running'))::integer AS running
  FROM doomed
 GROUP BY step_index, component
 ORDER BY step_index, component;
