-- claim_fair_round: many picks of the fair order in one statement, where the head of the order
-- says exactly what picking one item at a time would choose. claim_items calls it for a run of
-- its requests that share a service and querier, when the service has one component with
-- claimable work and one tenant competing for it: then the order is that tenant's users alone
-- (claim_items step 3).
--
-- Why the head says it: serving a user at share s (running items × 1,000,000 / weight) moves
-- it to (its next share, now), behind everyone at that share who was there before. So the picks
-- go in order of share: at each share first the users who started there, in the order's own
-- order, then those raised to it, in the order they were raised (sort_key below). Read from the
-- head of the order, this sequence is exact up to the share of the first row the head cannot
-- vouch for: the row where the LIMIT cut it (users beyond it may start at its share), or a row
-- whose copies lag its user's counts or policy, or whose user had a step become claimable
-- since the statement's snapshot was taken (unseen by the set), or whose user has work under
-- actors (the order then goes down the actor tree). A user's later picks take further items
-- of its step when that step is its only claimable one, as far as its cap and bucket allow;
-- with more steps the next pick may go to another step, so the sequence stops there. Each pick
-- is stamped a microsecond after the one before, so that they keep their order in last_worked.
-- The caller takes the rest one pick at a time; a tenant with a cap or a rate limit it takes
-- one pick at a time from the start (admit_tenant).
--
-- Arguments: the service, querier and component; p_slots, one element per item the run still
-- wants, in the order they are served: the request it is for (an index into p_workers and
-- p_tokens, claim_items' arrays); the lease in milliseconds.
-- Answer: a row per pick, in order, with the request its item went to; id is NULL for a pick
-- whose item another transaction held after all, which is where the caller stops taking sets.
-- Locks: as claim_items' picks take them: the head's users rows (SKIP LOCKED), the items
-- (SKIP LOCKED), then the counter rows. Only the one-tenant order is read, so no tenant row
-- is locked or written.

CREATE OR REPLACE FUNCTION claim_fair_round(
    p_service text,
    p_querier text,
    p_component text,
    p_slots integer[],
    p_workers integer[],
    p_tokens bigint[],
    p_lease_ms bigint
)
RETURNS TABLE (
    request integer,
    username text,
    tenant text,
    id bigint,
    job_id uuid,
    step_index integer,
    payload jsonb,
    inputs jsonb,
    attempt integer,
    lease_expires_at timestamptz,
    traceparent text
)
LANGUAGE plpgsql
-- Planned once: a plan made afresh for each set would cost more than the set saves. Never
-- compiled: the plan cannot see how many items each user takes, so its estimate can pass
-- jit_above_cost, and compiling would cost many times what the set does. Never a scan: the
-- plan expects one row where a set has one per user, so against a small table (a thousand
-- users) a scan looks cheaper than the probes, and the session would then scan it once per
-- user for as long as it lives.
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $round$
#variable_conflict use_column
DECLARE
    v_at timestamptz := clock_timestamp();
    v_tenant text;
    v_tenant_policed boolean;
    v_least bigint;
    v_first_lags boolean;
BEGIN
    -- The one active tenant queue, read as the one-at-a-time claim reads the tenants, and in
    -- the same statement the head of its users' order: its share, the least work in progress
    -- in the order. No user further ahead of it than there are items wanted can be reached,
    -- and bounding the head by that keeps its read a short range of the order's index: the
    -- plan, made once, cannot see the LIMIT. A first row that lags its user would end the set
    -- before its first pick: then the caller's single claims, which bring such rows level, go
    -- on at once. (Read without the user's lock: the set checks again under it.)
    SELECT tq.tenant, t.max_running > 0 OR t.rate_per_second > 0, first.share, first.lags
      INTO v_tenant, v_tenant_policed, v_least, v_first_lags
      FROM tenant_queues tq
      JOIN tenants t ON t.tenant = tq.tenant
      LEFT JOIN LATERAL (
           SELECT su.share,
                  (u.running_count, u.last_worked, u.weight, u.max_running,
                   u.throttled_until IS NOT NULL)
                      IS DISTINCT FROM (su.running_count, su.last_worked, su.weight,
                                        su.max_running, su.throttled) AS lags
             FROM service_users su
             JOIN users u ON u.username = su.username
            WHERE (su.service, su.component, su.tenant) = (p_service, p_component, tq.tenant)
              AND su.in_order
              AND su.ready_count > 0
            ORDER BY {{user_order su}}
            LIMIT 1
           ) first ON true
     WHERE tq.service = p_service
       AND tq.component = p_component
       AND tq.active
       -- A scalar subquery, not EXISTS: it stays a primary-key probe.
       AND (NOT t.sharded
            OR (SELECT true
                  FROM tenant_shards ts
                 WHERE ts.tenant = tq.tenant
                   AND ts.querier = p_querier))
     ORDER BY {{tenant_order tq}}
     LIMIT 1;
    -- A tenant with a cap or a rate limit is admitted one item at a time (admit_tenant).
    IF v_tenant_policed OR v_least IS NULL OR v_first_lags THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH candidates AS (
        SELECT su.username, su.running_count, su.weight, su.max_running, su.throttled,
               su.share, su.last_worked, su.ready_count, su.local_ready,
               row_number() OVER (ORDER BY {{user_order su}}) AS place
          FROM (SELECT su.*
                  FROM service_users su
                 WHERE su.service = p_service
                   AND su.component = p_component
                   AND su.tenant = v_tenant
                   AND su.in_order
                   AND su.ready_count > 0
                   -- From 0: a count that fell since v_least was read still sorts first.
                   AND su.share BETWEEN 0 AND v_least + cardinality(p_slots) * 1000000::bigint
                 ORDER BY {{user_order su}}
                 LIMIT cardinality(p_slots)) su
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
        -- spread over the head's users, so that a set stays about that size.
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
               -- Whether the head holds a user for every item wanted at or below the least
               -- share any user reaches by a second pick: then each takes one pick, in the
               -- head's order, and no user's later picks need working out.
               (SELECT count(*) >= cardinality(p_slots)
                  FROM head h
                 WHERE h.share <= (SELECT min((m.running_count + 1)::bigint * 1000000 / m.weight)
                                     FROM head m))
                   AS one_pick_each,
               (SELECT bool_or(h.weight > 1) FROM head h) AS weighted
    ), steps AS MATERIALIZED (
        -- Each usable user's best step, and, where it may take more than one pick, whether
        -- that is its only claimable step: such a user takes successive items of it; a user
        -- with more takes one item a set.
        SELECT h.username, h.running_count, h.weight, h.share, h.allowed, h.place, s.job_id,
               s.step_index, s.ready_from,
               s.first_claim, s.ready_count AS step_ready,
               (SELECT count(*)
                  FROM (SELECT 1
                          FROM user_work other
                         WHERE other.service = p_service
                           AND other.component = p_component
                           AND other.tenant = v_tenant
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
                  AND uw.tenant = v_tenant
                  AND uw.username = h.username
                  AND uw.actor = '{}'
                  AND uw.claimable
                ORDER BY {{step_order uw}}
                LIMIT 1
               ) s
         WHERE b.first_inexact IS NULL OR h.place < b.first_inexact
    ), picks AS (
        -- A user's k-th pick (from 0) is made at its share with running_count + k items in
        -- progress. At a share, those that started there go first (worked longest ago), then
        -- those raised to it, in the order they were raised: so a pick sorts by its share, then
        -- by its user's previous pick, recursively, down to the user's place in the head
        -- (sort_key, compared as an array; -1 marks the start, below every share). Where every
        -- weight is 1, the shares a user passes are one level apart, and the previous picks'
        -- order is the users' running counts, highest first, then their places. A user with
        -- another step takes its second pick from whichever step is then best: that pick is a
        -- wall the set stops at. Picks go up to share_cap, and no further than the user's cap
        -- and bucket allow: a user at either has left the order.
        SELECT s.*, k + 1 AS nth,
               (s.running_count + k)::bigint * 1000000 / s.weight AS pick_share,
               CASE WHEN b.weighted THEN
                   ARRAY(SELECT (s.running_count + j)::bigint * 1000000 / s.weight
                           FROM generate_series(k, 0, -1) j)
                   || ARRAY[-1, s.place]
               END AS sort_key,
               (k = 0 OR s.only_step)
               AND (b.known_share IS NULL
                    OR (s.running_count + k)::bigint * 1000000 / s.weight < b.known_share
                    OR (k = 0 AND s.share = b.known_share)) AS exact
          FROM steps s
         CROSS JOIN bounds b
         CROSS JOIN LATERAL generate_series(
               0, CASE WHEN b.one_pick_each THEN 0
                       ELSE least(CASE WHEN s.only_step THEN s.step_ready ELSE 2 END,
                                  s.allowed,
                                  ((b.share_cap + 1) * s.weight + 999999) / 1000000
                                      - s.running_count)
                            - 1
                  END) k
    ), chosen AS (
        SELECT q.username, q.job_id, q.step_index, q.ready_from, q.first_claim, q.only_step,
               q.nth, q.seq,
               p_slots[q.seq] AS request,
               v_at + (q.seq - 1) * interval '1 microsecond' AS at
          FROM (SELECT o.*, bool_and(o.exact) OVER (ORDER BY o.seq) AS in_prefix
                  FROM (SELECT p.*,
                               row_number() OVER (ORDER BY p.pick_share, p.sort_key,
                                                           p.running_count DESC, p.place)
                                   AS seq
                          FROM picks p) o) q
         WHERE q.in_prefix
           AND q.seq <= cardinality(p_slots)
    ), free AS (
        -- Each user's items: the lowest free ready ones of its step, one per pick, in order.
        SELECT c.username,
               ARRAY(SELECT ready.id
                       FROM work_items ready
                      WHERE ready.job_id = c.job_id
                        AND ready.step_index = c.step_index
                        AND ready.component = p_component
                        AND ready.status = 'ready'
                        AND ready.id >= c.ready_from
                      ORDER BY ready.id
                      LIMIT c.picks
                        FOR NO KEY UPDATE SKIP LOCKED) AS ids
          FROM (SELECT c.username, c.job_id, c.step_index, c.ready_from, count(*) AS picks
                  FROM chosen c
                 GROUP BY c.username, c.job_id, c.step_index, c.ready_from) c
    ), item AS (
        UPDATE work_items wi
           SET status = 'running',
               attempt = wi.attempt + 1,
               lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
               querier = p_querier,
               worker = p_workers[c.request],
               claimed_by = p_tokens[c.request],
               updated_at = now()
          FROM chosen c
          JOIN free f ON f.username = c.username
         WHERE wi.id = f.ids[c.nth]
           -- The same rows, as a list the primary key is probed with.
           AND wi.id = ANY (ARRAY(SELECT unnest(listed.ids) FROM free listed))
     RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt,
               wi.lease_expires_at, c.username, c.seq, c.at, c.first_claim, c.only_step,
               (SELECT j.traceparent FROM jobs j WHERE j.job_id = wi.job_id) AS traceparent
    ), claimed AS (
        SELECT i.username, i.job_id, i.step_index, count(*)::integer AS items,
               max(i.at) AS last_at, max(i.id) AS last_id, bool_and(i.only_step) AS only_step
          FROM item i
         GROUP BY i.username, i.job_id, i.step_index
    ), counted_steps AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count - cl.items,
               running_count = uw.running_count + cl.items,
               last_worked = cl.last_at,
               -- A lone claimable step has no order to keep, and leaving its order column
               -- keeps the update HOT (track_claimable_step levels it if another step joins).
               order_worked = CASE WHEN cl.only_step THEN uw.order_worked ELSE cl.last_at END,
               ready_from = greatest(uw.ready_from, cl.last_id)
          FROM claimed cl
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (cl.job_id, cl.step_index, p_component)
           AND uw.job_id = ANY (ARRAY(SELECT listed.job_id FROM claimed listed))
    ), user_counts AS (
        -- As claim_items bills a rate-limited user's bucket, for all its picks at once.
        UPDATE users u
           SET running_count = u.running_count + cl.items,
               last_worked = cl.last_at,
               next_free = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_charged(u.rate_per_second, u.next_free, cl.items) END,
               throttled_until = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_due(u.rate_per_second, u.burst,
                              bucket_charged(u.rate_per_second, u.next_free, cl.items))
               END
          FROM claimed cl
         WHERE u.username = cl.username
           AND u.username = ANY (ARRAY(SELECT listed.username FROM claimed listed))
     RETURNING u.username, cl.items, u.running_count, u.last_worked,
               u.throttled_until IS NOT NULL AS throttled, cl.only_step, cl.job_id,
               cl.step_index
    ), queues AS (
        UPDATE service_users su
           SET running_count = uc.running_count,
               last_worked = uc.last_worked,
               throttled = uc.throttled,
               ready_count = su.ready_count - uc.items,
               local_ready = su.local_ready - uc.items,
               local_running = su.local_running + uc.items,
               local_last_worked = uc.last_worked,
               lone_job_id = CASE WHEN uc.only_step THEN uc.job_id ELSE su.lone_job_id END,
               lone_step_index = CASE WHEN uc.only_step THEN uc.step_index
                                      ELSE su.lone_step_index END
          FROM user_counts uc
         WHERE (su.username, su.service, su.component, su.tenant)
               = (uc.username, p_service, p_component, v_tenant)
           AND su.username = ANY (ARRAY(SELECT listed.username FROM claimed listed))
    ), started AS (
        -- Only a step never worked before can belong to a job not yet running.
        UPDATE jobs j
           SET status = 'running', updated_at = now()
         WHERE j.job_id = ANY (ARRAY(SELECT listed.job_id FROM item listed
                                      WHERE listed.first_claim))
           AND j.status = 'accepted'
    )
    SELECT c.request, c.username, v_tenant, i.id, i.job_id, i.step_index, i.payload,
           i.inputs, i.attempt, i.lease_expires_at, i.traceparent
      FROM chosen c
      LEFT JOIN item i ON i.seq = c.seq
     ORDER BY c.seq;
END;
$round$;
