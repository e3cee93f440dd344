-- For each of items $1, the attempt its retry budget counts from (retry_base: raised by an
-- operator's retry and by a worker's release) and its job's retry policy (all NULL: none).
SELECT wi.id, wi.retry_base, j.retry_max_attempts, j.retry_backoff, j.retry_initial_ms,
       j.retry_max_ms
  FROM work_items wi
  JOIN jobs j ON j.job_id = wi.job_id
 WHERE wi.id = ANY($1::bigint[]);
