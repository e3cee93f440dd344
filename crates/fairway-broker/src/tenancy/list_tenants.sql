-- Tenants (all, or only $1) with their limits, how many items wait, and the queriers that
-- serve them: the shard when sharded, else every member.
SELECT t.tenant,
       t.max_queriers,
       t.max_outstanding,
       t.sharded,
       (SELECT coalesce(sum(uw.ready_count), 0)
          FROM jobs j
          JOIN user_work uw ON uw.job_id = j.job_id
         WHERE j.tenant = t.tenant
           AND j.status IN ('accepted', 'running', 'paused'))::bigint AS outstanding,
       CASE
           WHEN t.sharded THEN
               coalesce((SELECT array_agg(ts.querier ORDER BY ts.querier)
                           FROM tenant_shards ts
                          WHERE ts.tenant = t.tenant), '{}')
           ELSE
               coalesce((SELECT array_agg(q.querier ORDER BY q.querier)
                           FROM queriers q
                          WHERE q.in_shards), '{}')
       END AS queriers,
       t.created_at,
       t.updated_at
  FROM tenants t
 WHERE $1::text IS NULL OR t.tenant = $1
 ORDER BY t.tenant;
