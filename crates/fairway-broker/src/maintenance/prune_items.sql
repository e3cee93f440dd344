-- Deletes up to $2 items of jobs $1 (finished, and locked by the caller) and takes them off
-- their steps' counts, so that the counters still match the items left. Returns how many items
-- it deleted.
WITH doomed AS (
    SELECT id
      FROM work_items
     WHERE job_id = ANY($1::uuid[])
     LIMIT $2
), deleted AS (
    DELETE FROM work_items wi
     USING doomed
     WHERE wi.id = doomed.id
    RETURNING wi.job_id, wi.step_index, wi.component, wi.status
), counts AS (
    SELECT job_id,
           step_index,
           component,
           (count(*) FILTER (WHERE status = 'ready'))::integer AS ready,
           (count(*) FILTER (WHERE status = 'running'))::integer AS running,
           (count(*) FILTER (WHERE status = 'successful'))::integer AS successful,
           (count(*) FILTER (WHERE status = 'failed'))::integer AS failed,
           (count(*) FILTER (WHERE status = 'canceled'))::integer AS canceled
      FROM deleted
     GROUP BY job_id, step_index, component
), counted AS (
    UPDATE user_work uw
       SET ready_count = uw.ready_count - counts.ready,
           running_count = uw.running_count - counts.running,
           successful_count = uw.successful_count - counts.successful,
           failed_count = uw.failed_count - counts.failed,
           canceled_count = uw.canceled_count - counts.canceled
      FROM counts
     WHERE (uw.job_id, uw.step_index, uw.component)
         = (counts.job_id, counts.step_index, counts.component)
)
SELECT count(*) AS deleted FROM deleted;
