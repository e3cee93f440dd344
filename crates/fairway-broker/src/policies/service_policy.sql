-- Service $1's policy and its items running now, with known false when no job has named the
-- service and no policy exists for it. A service without a policy row has the defaults: no cap,
-- no rate limit.
SELECT $1::text AS service,
       coalesce(sp.max_running, 0) AS max_running,
       coalesce(sp.rate_per_second, 0) AS rate_per_second,
       coalesce(sp.burst, 1) AS burst,
       service_running($1) AS running,
       sp.service IS NOT NULL
           OR EXISTS (SELECT 1 FROM tenant_queues tq WHERE tq.service = $1) AS known
  FROM (SELECT) AS one
  LEFT JOIN service_policies sp ON sp.service = $1;
