-- How many of tenant $1's items are waiting: ready (paused ones too) or scheduled. Run as its
-- own statement after lock_tenant_limit.sql, so that its snapshot includes every submission
-- that held the lock before.
SELECT coalesce(sum(uw.ready_count + uw.scheduled_count), 0)::bigint AS outstanding
  FROM jobs j
  JOIN user_work uw ON uw.job_id = j.job_id
 WHERE j.tenant = $1
   AND j.status IN ('accepted', 'running', 'paused');
