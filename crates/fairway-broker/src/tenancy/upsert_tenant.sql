-- Sets tenant $1's limits and policy, creating it if need be: $2 max_queriers,
-- $3 max_outstanding, $4 weight, $5 max_running, $6 rate_per_second, $7 burst, $8 tier, each
-- NULL to keep the value it has (or its default). A changed rate or burst starts the bucket
-- afresh. The tenant's queues take a new weight and tier in the same statement, so that the
-- next claim orders by them.
WITH changed AS (
    INSERT INTO tenants AS t (tenant, max_queriers, max_outstanding, weight, max_running,
                              rate_per_second, burst, tier)
    VALUES ($1, coalesce($2::integer, 0), coalesce($3::integer, 0), coalesce($4::integer, 1),
            coalesce($5::integer, 0), coalesce($6::double precision, 0),
            coalesce($7::integer, 1), coalesce($8::integer, 3))
        ON CONFLICT (tenant) DO UPDATE
       SET max_queriers = coalesce($2::integer, t.max_queriers),
           max_outstanding = coalesce($3::integer, t.max_outstanding),
           weight = coalesce($4::integer, t.weight),
           tier = coalesce($8::integer, t.tier),
           max_running = coalesce($5::integer, t.max_running),
           rate_per_second = coalesce($6::double precision, t.rate_per_second),
           burst = coalesce($7::integer, t.burst),
           next_free = CASE
               WHEN (coalesce($6::double precision, t.rate_per_second),
                     coalesce($7::integer, t.burst))
                    = (t.rate_per_second, t.burst) THEN t.next_free
           END,
           updated_at = now()
    RETURNING t.tenant, t.weight, t.tier
)
UPDATE tenant_queues tq
   SET weight = c.weight,
       tier = c.tier
  FROM changed c
 WHERE tq.tenant = c.tenant
   AND (tq.weight, tq.tier) <> (c.weight, c.tier);
