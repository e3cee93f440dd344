-- Of the queriers that hold no lease: takes those shutting down out of the shards, and forgets
-- those silent for longer than $1 milliseconds. Returns how many changed; shards must then be
-- redrawn. The caller holds the membership lock. A querier shutting down is silent whatever it
-- sends (its requests get 410 and do not move last_seen), so forgetting is the shutdown's end:
-- a pod that kept its name across a restart joins afresh with its next request.
WITH holders AS (
    -- One pass over the running items (the leases index), whatever the number of queriers.
    SELECT DISTINCT wi.querier
      FROM work_items wi
     WHERE wi.status = 'running'
       AND wi.querier IS NOT NULL
), idle AS (
    SELECT q.querier,
           q.state,
           q.in_shards,
           q.last_seen < now() - $1::bigint * interval '1 millisecond' AS silent
      FROM queriers q
      LEFT JOIN holders h ON h.querier = q.querier
     WHERE h.querier IS NULL
), forgotten AS (
    DELETE FROM queriers q
     USING idle
     WHERE q.querier = idle.querier
       AND idle.silent
 RETURNING q.querier
), left_shards AS (
    UPDATE queriers q
       SET in_shards = false
      FROM idle
     WHERE q.querier = idle.querier
       AND NOT idle.silent
       AND idle.state = 'shutting_down'
       AND idle.in_shards
 RETURNING q.querier
)
SELECT (SELECT count(*) FROM forgotten) + (SELECT count(*) FROM left_shards) AS changed;
