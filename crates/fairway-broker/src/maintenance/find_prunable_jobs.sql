-- Up to $2 jobs that finished more than $1 milliseconds ago, oldest first, locked until the
-- caller's transaction ends; rows another pruner holds are skipped, not waited for.
SELECT job_id
  FROM jobs
 WHERE status IN ('successful', 'complete_with_errors', 'failed', 'canceled')
   AND updated_at < now() - $1::bigint * interval '1 millisecond'
 ORDER BY updated_at, job_id
 LIMIT $2
   FOR UPDATE SKIP LOCKED;
