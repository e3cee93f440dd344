-- How many of tenant $1's items are ready and waiting (paused ones too). Run as its own
-- statement after lock_tenant_limit.sql, so that its snapshot includes every submission that
-- held the lock before.
SELECT coalesce(sum(ready_count), 0)::bigint AS outstanding
  FROM user_work
 WHERE tenant = $1
   AND ready_count > 0;
