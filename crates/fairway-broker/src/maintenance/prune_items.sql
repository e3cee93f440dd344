-- Deletes up to $2 items of jobs $1 (finished, and locked by the caller) and takes them off
-- their steps' counts (count_removed_items), so that the counters still match the items left.
-- Returns how many items it deleted.
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
), counted AS (
    SELECT count_removed_items(array_agg(job_id), array_agg(step_index), array_agg(component),
                               array_agg(status::text)) AS steps
      FROM deleted
)
SELECT (SELECT count(*) FROM deleted) AS deleted
  -- Referenced, so that the counts move with the deletion.
  FROM counted;
