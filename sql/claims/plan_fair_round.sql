-- plan_fair_round: the picks claim_fair_round takes as one set, worked out from the head of
-- one tenant queue's users' order, as far as that head says exactly what picking one item at a
-- time would choose.
--
-- The head says it up to the share of the first row it cannot vouch for: where the LIMIT cut
-- it, or a row that lags its user, saw a step become claimable since this snapshot, or has
-- work under actors. Why the picks then follow by share and by when each user was raised to
-- it is in docs/design.md, "Many choices as one set". Only the head's tier is read: a user's
-- tier does not move, and every user of a later tier waits for those of the head's.
-- Arguments: the service, component and tenant; p_tier and p_least, the tier and share at the
-- head of the order; p_slots, one element per item wanted, in the order they are served (the
-- request each is for); p_at, the instant of the first pick.
-- Answer: a row per pick, in order (seq), with its request, user, step and the step's
-- ready_from, whether it is the step's first claim and the user's only claimable step, which
-- of the user's picks it is (nth, from 1) and its instant; and the user's queue row's pass,
-- fresh flag and weight, from which the set's turns are taken (take_turns).
-- Locks: the head's users rows (SKIP LOCKED), in the order's order.

CREATE OR REPLACE FUNCTION plan_fair_round(
    p_service text,
    p_component text,
    p_tenant text,
    p_tier smallint,
    p_least bigint,
    p_slots integer[],
    p_at timestamptz
)
RETURNS TABLE (
    seq bigint, request integer, username text, job_id uuid, step_index integer,
    ready_from bigint, first_claim boolean, only_step boolean, nth bigint, at timestamptz,
    pass bigint, fresh boolean, weight integer
)
LANGUAGE plpgsql
-- No settings of its own: it runs under those of claim_fair_round, its only caller (planned
-- once, never compiled, never a scan), and setting them again would cost every set.
AS $plan$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT su.username, su.running_count, su.weight, su.max_running, su.throttled,
               su.share, su.last_worked, su.ready_count, su.local_ready, su.pass, su.fresh,
               row_number() OVER (ORDER BY {{user_order su}}) AS place
          FROM (SELECT su.*
                  FROM service_users su
                 WHERE su.service = p_service
                   AND su.component = p_component
                   AND su.tenant = p_tenant
                   AND su.in_order
                   AND su.ready_count > 0
                   AND su.tier = p_tier
                   -- From 0: a count that fell since p_least was read still sorts first.
                   AND su.share BETWEEN 0 AND p_least + cardinality(p_slots) * 1000000::bigint
                 ORDER BY {{user_order su}}
                 LIMIT cardinality(p_slots)) su
         -- Said again out here, so that the window knows the rows come in its order unsorted.
         WHERE su.tier = p_tier
    ), head AS (
        -- The candidates whose users no other transaction holds, locked in order, and how many
        -- picks each user's cap and bucket still allow (one at least, for a row in the order
        -- whose copies are level).
        SELECT c.*,
               (u.running_count, u.last_worked, u.weight, u.max_running,
                u.throttled_until IS NOT NULL)
                   IS NOT DISTINCT FROM (c.running_count, c.last_worked, c.weight,
                                         c.max_running, c.throttled)
                   AND c.ready_count = c.local_ready
                   -- No step became claimable since this statement's snapshot: the reads of
                   -- user_work below would not see it (track_claimable_step records them).
                   AND u.step_made_claimable_by
                       IS NOT DISTINCT FROM (SELECT seen.step_made_claimable_by
                                               FROM users seen
                                              WHERE seen.username = c.username)
                   AS exact_row,
               least(CASE WHEN u.max_running > 0 THEN u.max_running - u.running_count END,
                     CASE WHEN u.rate_per_second > 0 THEN
                         bucket_tokens(u.rate_per_second, u.burst, u.next_free) END,
                     cardinality(p_slots)) AS allowed
          FROM candidates c
          JOIN LATERAL (SELECT u.step_made_claimable_by, u.running_count, u.last_worked,
                               u.weight, u.max_running, u.throttled_until, u.rate_per_second,
                               u.burst, u.next_free
                          FROM users u
                         WHERE u.username = c.username
                           FOR NO KEY UPDATE SKIP LOCKED) u ON true
    ), bounds AS (
        -- Where the head stops standing for the whole order: at its first row that lags or
        -- has work under actors, or at its last row when the LIMIT cut it (NULL: neither).
        -- Only shares below that row's are known; and only as far as the items wanted
        -- spread over the head's users, so that a set stays about that size. Whether the head
        -- holds a user for every item wanted at or below second_share, the least share any
        -- user reaches by a second pick: then each takes one pick, in the head's order, and no
        -- user's later picks need working out. (Answered here: a CTE of its own would add a
        -- plan level, which every set pays for.)
        SELECT coalesce(
                   (SELECT h.share
                      FROM head h
                     WHERE NOT h.exact_row
                     ORDER BY h.place
                     LIMIT 1),
                   (SELECT c.share
                      FROM candidates c
                     WHERE c.place = cardinality(p_slots))) AS known_share,
               (SELECT min(h.place) FROM head h WHERE NOT h.exact_row) AS first_inexact,
               (SELECT min(h.share)
                       + ceil(cardinality(p_slots)::numeric / nullif(count(*), 0))::bigint
                         * 1000000
                  FROM head h) AS share_cap,
               second.share AS second_share,
               (SELECT count(*) >= cardinality(p_slots) FROM head h
                 WHERE h.share <= second.share) AS one_pick_each,
               (SELECT bool_or(h.weight > 1) FROM head h) AS weighted
          FROM (SELECT min((m.running_count + 1)::bigint * 1000000 / m.weight) AS share
                  FROM head m) second
    ), steps AS MATERIALIZED (
        -- Each usable user's best step, and, where it may take more than one pick, whether
        -- that is its only claimable step: such a user takes successive items of it; a user
        -- with more takes one item a set.
        SELECT h.username, h.running_count, h.weight, h.share, h.allowed, h.place, h.pass,
               h.fresh, s.job_id,
               s.step_index, s.ready_from,
               s.first_claim, s.ready_count AS step_ready,
               (SELECT count(*)
                  FROM (SELECT 1
                          FROM user_work other
                         WHERE other.service = p_service
                           AND other.component = p_component
                           AND other.tenant = p_tenant
                           AND other.username = h.username
                           AND other.actor = '{}'
                           AND other.claimable
                         LIMIT 2) two) = 1 AS only_step
          FROM head h
         CROSS JOIN bounds b
         CROSS JOIN LATERAL (
               SELECT uw.job_id, uw.step_index, uw.ready_from, uw.ready_count,
                      uw.last_worked IS NULL AS first_claim
                 FROM user_work uw
                WHERE uw.service = p_service
                  AND uw.component = p_component
                  AND uw.tenant = p_tenant
                  AND uw.username = h.username
                  AND uw.actor = '{}'
                  AND uw.claimable
                ORDER BY {{step_order uw}}
                LIMIT 1
               ) s
         WHERE b.first_inexact IS NULL OR h.place < b.first_inexact
    ), picks AS (
        -- A user's k-th pick (from 0) is made at its share with running_count + k items in
        -- progress. At a share, those that started there go first, in the head's order, then
        -- those raised to it, in the order they were raised (each raised user's pass is then at
        -- least the order's clock plus a stride, past those that started there). Where every
        -- weight is 1, the shares a user passes are one level apart, and the order they were
        -- raised in is the users' running counts, highest first, then their places. Weighted
        -- users take one pick each, and only below second_share, where no raised user can come
        -- between them: their later turns depend on passes the set does not work out. A user
        -- with another step takes its second pick from whichever step is then best: that pick
        -- is a wall the set stops at. Picks go up to share_cap, and no further than the user's
        -- cap and bucket allow: a user at either has left the order.
        SELECT s.*, k + 1 AS nth, b.weighted,
               (s.running_count + k)::bigint * 1000000 / s.weight AS pick_share,
               (k = 0 OR s.only_step)
               AND (NOT b.weighted OR s.share < b.second_share)
               AND (b.known_share IS NULL
                    OR (s.running_count + k)::bigint * 1000000 / s.weight < b.known_share
                    OR (k = 0 AND s.share = b.known_share)) AS exact
          FROM steps s
         CROSS JOIN bounds b
         CROSS JOIN LATERAL generate_series(
               0, CASE WHEN b.one_pick_each OR b.weighted THEN 0
                       ELSE least(CASE WHEN s.only_step THEN s.step_ready ELSE 2 END,
                                  s.allowed,
                                  ((b.share_cap + 1) * s.weight + 999999) / 1000000
                                      - s.running_count)
                            - 1
                  END) k
    ), chosen AS (
        SELECT q.username, q.job_id, q.step_index, q.ready_from, q.first_claim, q.only_step,
               q.nth, q.seq, q.pass, q.fresh, q.weight,
               p_slots[q.seq] AS request,
               p_at + (q.seq - 1) * interval '1 microsecond' AS at
          FROM (SELECT o.*, bool_and(o.exact) OVER (ORDER BY o.seq) AS in_prefix
                  FROM (SELECT p.*,
                               row_number() OVER (ORDER BY p.pick_share,
                                                           CASE WHEN NOT p.weighted THEN
                                                               p.running_count
                                                           END DESC,
                                                           p.place)
                                   AS seq
                          FROM picks p) o) q
         WHERE q.in_prefix
           AND q.seq <= cardinality(p_slots)
    )
    SELECT c.seq, c.request, c.username, c.job_id, c.step_index, c.ready_from, c.first_claim,
           c.only_step, c.nth, c.at, c.pass, c.fresh, c.weight
      FROM chosen c;
END;
$plan$;
