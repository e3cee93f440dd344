-- Records that querier $1 asked for work, at most once per $2 milliseconds: the row is shared
-- by all of the querier's workers. A querier shutting down is not heard (retire_queriers.sql).
UPDATE queriers
   SET last_seen = now()
 WHERE querier = $1
   AND state = 'active'
   AND last_seen < now() - $2::bigint * interval '1 millisecond';
