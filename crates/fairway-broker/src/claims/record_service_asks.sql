-- Records that workers asked for service $1[i]'s work at $2[i], keeping the latest time any
-- broker saw: a broker flushes what it saw every few seconds, in no order with the others.
INSERT INTO service_asks AS asks (service, last_asked)
SELECT service, last_asked
  FROM unnest($1::text[], $2::timestamptz[]) AS seen(service, last_asked)
    ON CONFLICT (service) DO UPDATE
   SET last_asked = greatest(asks.last_asked, excluded.last_asked);
