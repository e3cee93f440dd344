-- Finishes job $1 when nothing is ready or running: no further item can then be created,
-- because new items are created in the same transaction as the change that produces them.
WITH counts AS (
    SELECT sum(ready_count) AS ready,
           sum(running_count) AS running,
           sum(successful_count) AS successful,
           sum(failed_count) AS failed
      FROM user_work
     WHERE job_id = $1
)
UPDATE jobs j
   SET status = CASE
                    WHEN counts.failed = 0 THEN 'successful'
                    WHEN counts.successful > 0 THEN 'complete_with_errors'
                    ELSE 'failed'
                END::job_status,
       updated_at = now()
  FROM counts
 WHERE j.job_id = $1
   AND j.status IN ('accepted', 'running', 'paused')
   AND counts.ready = 0
   AND counts.running = 0;
