-- has_claimable_work: whether a service has claimable work for a querier at all. Tells a claim
-- that came back empty whether it lost a race (try again), or the only work there is belongs to
-- users at their cap or out of tokens (look again when a slot frees or a bucket refills), or
-- there is nothing for it to do (no row). in_order is true for the first; for the second, throttled_until is
-- when one such user's next item is due, or NULL for a cap. The first tenant queue with work in
-- the claim's order answers, read from the indexes, so a queue further on whose users are held
-- is missed; either answer has the claim look again soon.
--
-- Arguments: the service and the querier asking. Answer: no row, or one as above.

CREATE OR REPLACE FUNCTION has_claimable_work(
    p_service text,
    p_querier text,
    OUT in_order boolean,
    OUT throttled_until timestamptz
)
RETURNS SETOF record
LANGUAGE sql
STABLE
AS $claimable$
    SELECT w.in_order, w.throttled_until
      FROM tenant_queues tq
      JOIN tenants t ON t.tenant = tq.tenant
     CROSS JOIN LATERAL (
           SELECT su.in_order,
                  (SELECT u.throttled_until FROM users u WHERE u.username = su.username)
                      AS throttled_until
             FROM service_users su
            WHERE su.service = p_service
              AND su.component = tq.component
              AND su.tenant = tq.tenant
              AND su.ready_count > 0
            ORDER BY su.in_order DESC
            LIMIT 1
           ) w
     WHERE tq.service = p_service
       AND tq.active
       -- A scalar subquery, not EXISTS: the planner keeps it a primary-key probe per tenant
       -- instead of hashing every shard row of the querier.
       AND (NOT t.sharded
            OR (SELECT true
                  FROM tenant_shards ts
                 WHERE ts.tenant = tq.tenant
                   AND ts.querier = p_querier))
     -- The claim's order: read from its index, it stops at the first tenant with work.
     ORDER BY tq.component, {{tenant_order tq}}
     LIMIT 1;
$claimable$;
