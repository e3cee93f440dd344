-- The traceparents of the jobs whose items a claim batch handed out, read once per batch
-- after the claim committed. Jobs without one have no row.
-- $1 job ids.
SELECT job_id, traceparent
  FROM jobs
 WHERE job_id = ANY($1)
   AND traceparent IS NOT NULL;
