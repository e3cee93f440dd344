-- Every querier with its leases and the sharded tenants it serves. $1: milliseconds of silence
-- after which an active querier is reported disconnected.
SELECT q.querier,
       CASE
           WHEN q.state = 'shutting_down' THEN 'shutting_down'
           WHEN q.last_seen < now() - $1::bigint * interval '1 millisecond' THEN 'disconnected'
           ELSE 'active'
       END AS state,
       q.in_shards,
       q.joined_at,
       q.last_seen,
       coalesce(held.leases, 0) AS leases,
       coalesce((SELECT array_agg(ts.tenant ORDER BY ts.tenant)
                   FROM tenant_shards ts
                  WHERE ts.querier = q.querier), '{}') AS tenants
  FROM queriers q
  -- One pass over the running items (the leases index), whatever the number of queriers.
  LEFT JOIN (SELECT wi.querier, count(*) AS leases
               FROM work_items wi
              WHERE wi.status = 'running'
              GROUP BY wi.querier) held ON held.querier = q.querier
 ORDER BY q.querier;
