-- finish_jobs: finishes each of jobs p_job_ids that has nothing ready, scheduled or running: no
-- further item can then be created, because new items are created in the same transaction as
-- the change that produces them. One call for a batch of endings, however many jobs they
-- finished. Wakes whoever waits for a job it finished (GET /jobs/{id}?wait=), in every broker,
-- at commit. PL/pgSQL rather than SQL: a session keeps a PL/pgSQL function's plan, while it
-- plans a SQL function's body that cannot be inlined, as this one's UPDATE cannot, on every call.
--
-- Arguments: the jobs, in id order. Answer: none.
-- Locks: the finished jobs' rows, in the order given.

CREATE OR REPLACE FUNCTION finish_jobs(p_job_ids uuid[])
RETURNS void
LANGUAGE plpgsql
AS $finish_jobs$
DECLARE
    v_finished bigint;
BEGIN
    WITH counts AS (
        -- Per job, from its own rows: a LATERAL sum rather than a GROUP BY, which could sort.
        SELECT job.id AS job_id, c.ready, c.scheduled, c.running, c.successful, c.failed
          FROM unnest(p_job_ids) AS job(id)
         CROSS JOIN LATERAL (
               SELECT sum(uw.ready_count) AS ready,
                      sum(uw.scheduled_count) AS scheduled,
                      sum(uw.running_count) AS running,
                      sum(uw.successful_count) AS successful,
                      sum(uw.failed_count) AS failed
                 FROM user_work uw
                WHERE uw.job_id = job.id
               ) c
    ), finished AS (
        UPDATE jobs j
           SET status = CASE
                            WHEN counts.failed = 0 THEN 'successful'
                            WHEN counts.successful > 0 THEN 'complete_with_errors'
                            ELSE 'failed'
                        END::job_status,
               updated_at = now()
          FROM counts
         WHERE j.job_id = counts.job_id
           AND j.status IN ('accepted', 'running', 'paused')
           AND counts.ready = 0
           AND counts.scheduled = 0
           AND counts.running = 0
        RETURNING j.job_id
    )
    -- PL/pgSQL runs a data-modifying WITH only as a SELECT ... INTO; the count goes unused.
    SELECT count(pg_notify('fairway_job_finished', finished.job_id::text))
      INTO v_finished
      FROM finished;
END;
$finish_jobs$;
