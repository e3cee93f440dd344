-- Querier $1's state, and whether its last_seen is older than $2 milliseconds (worth a touch).
SELECT state::text AS state,
       last_seen < now() - $2::bigint * interval '1 millisecond' AS stale
  FROM queriers
 WHERE querier = $1;
