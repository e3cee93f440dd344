-- When workers last asked for each service's work, in any broker: one row per service ever
-- asked for.
SELECT service, last_asked
  FROM service_asks;
