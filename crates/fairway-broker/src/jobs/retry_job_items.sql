-- Puts every failed item of job $1 back to ready with a fresh retry budget: its next claim is
-- its next attempt, and its retries count from the attempt it failed at. Returns, per step
-- and component, how many items were retried, for the counters.
WITH failed AS (
    SELECT id, step_index, component
      FROM work_items
     WHERE job_id = $1
       AND status = 'failed'
       FOR NO KEY UPDATE
), retried AS (
    UPDATE work_items wi
       SET status = 'ready', retry_base = wi.attempt, updated_at = now()
      FROM failed
     WHERE wi.id = failed.id
)
SELECT step_index, component, count(*)::integer AS retried
  FROM failed
 GROUP BY step_index, component
 ORDER BY step_index, component;
