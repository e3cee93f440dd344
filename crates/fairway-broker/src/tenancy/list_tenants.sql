-- Tenants (all, or only $1) with their limits and policy, how many items wait and run, and the
-- queriers that serve them: the shard when sharded, else every member.
SELECT t.tenant,
       t.max_queriers,
       t.max_outstanding,
       t.weight,
       t.tier::integer AS tier,
       t.max_running,
       t.rate_per_second,
       t.burst,
       r.running,
       t.max_running > 0 AND r.running >= t.max_running AS at_cap,
       CASE WHEN t.rate_per_second > 0 THEN
           bucket_due(t.rate_per_second, t.burst, t.next_free) END AS throttled_until,
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
  -- Every running item read once, through the leases index, however many tenants are listed.
  LEFT JOIN (SELECT uw.tenant, count(*) AS items
               FROM work_items w
               JOIN user_work uw USING (job_id, step_index, component)
              WHERE w.status = 'running'
              GROUP BY uw.tenant) counted ON counted.tenant = t.tenant
 CROSS JOIN LATERAL (SELECT coalesce(counted.items, 0) AS running) r
 WHERE $1::text IS NULL OR t.tenant = $1
 ORDER BY t.tenant;
