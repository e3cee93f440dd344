-- Sets service $1's policy: $2 max_running, $3 rate_per_second, $4 burst, each NULL to keep
-- the value it has (or its default, for a service without a policy yet). A changed rate or
-- burst starts its bucket afresh.
INSERT INTO service_policies AS sp (service, max_running, rate_per_second, burst)
VALUES ($1, coalesce($2::integer, 0), coalesce($3::double precision, 0), coalesce($4::integer, 1))
    ON CONFLICT (service) DO UPDATE
   SET max_running = coalesce($2::integer, sp.max_running),
       rate_per_second = coalesce($3::double precision, sp.rate_per_second),
       burst = coalesce($4::integer, sp.burst),
       next_free = CASE
           WHEN (coalesce($3::double precision, sp.rate_per_second),
                 coalesce($4::integer, sp.burst))
                = (sp.rate_per_second, sp.burst) THEN sp.next_free
       END,
       updated_at = now();
