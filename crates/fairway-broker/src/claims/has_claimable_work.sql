-- Whether service $1 has claimable work for querier $2 at all: tells a claim that came back
-- empty whether it lost a race (try again) or there is nothing for it to do.
SELECT 1
  FROM tenant_queues tq
  JOIN tenants t ON t.tenant = tq.tenant
 WHERE tq.service = $1
   AND tq.active
   AND (NOT t.sharded
   -- A scalar subquery, not EXISTS: the planner keeps it a primary-key
                   -- probe per tenant instead of hashing every shard row of the querier.
                   OR (SELECT true
                         FROM tenant_shards ts
                        WHERE ts.tenant = tq.tenant
                          AND ts.querier = $2))
   AND EXISTS (
           SELECT 1
             FROM service_users su
            WHERE su.service = $1
              AND su.component = tq.component
              AND su.tenant = tq.tenant
              AND su.ready_count > 0
       )
 -- The claim's order: read from its index, it stops at the first tenant with work.
 ORDER BY tq.component, tq.running_count, tq.last_worked NULLS FIRST, tq.tenant
 LIMIT 1;
