-- count_removed_items: takes deleted items off their steps' counts, so that the counters still
-- match the items left. Only the user_work rows move: the pruner deletes the items of
-- finished jobs, which no user's queue counts any more.
--
-- Arguments: one entry per deleted item: its job, step, component and status.
-- Answer: how many step rows moved.
-- Locks: the steps' user_work rows.

CREATE OR REPLACE FUNCTION count_removed_items(
    p_job_ids uuid[],
    p_step_indexes integer[],
    p_components text[],
    p_statuses text[]
)
RETURNS integer
LANGUAGE plpgsql
AS $removed$
DECLARE
    v_steps integer;
BEGIN
    UPDATE user_work uw
       SET ready_count = uw.ready_count - counts.ready,
           running_count = uw.running_count - counts.running,
           successful_count = uw.successful_count - counts.successful,
           failed_count = uw.failed_count - counts.failed,
           canceled_count = uw.canceled_count - counts.canceled
      FROM (SELECT r.job_id, r.step_index, r.component,
                   (count(*) FILTER (WHERE r.status = 'ready'))::integer AS ready,
                   (count(*) FILTER (WHERE r.status = 'running'))::integer AS running,
                   (count(*) FILTER (WHERE r.status = 'successful'))::integer AS successful,
                   (count(*) FILTER (WHERE r.status = 'failed'))::integer AS failed,
                   (count(*) FILTER (WHERE r.status = 'canceled'))::integer AS canceled
              FROM unnest(p_job_ids, p_step_indexes, p_components, p_statuses)
                   AS r(job_id, step_index, component, status)
             GROUP BY r.job_id, r.step_index, r.component) counts
     WHERE (uw.job_id, uw.step_index, uw.component)
           = (counts.job_id, counts.step_index, counts.component);
    GET DIAGNOSTICS v_steps = ROW_COUNT;
    RETURN v_steps;
END;
$removed$;
