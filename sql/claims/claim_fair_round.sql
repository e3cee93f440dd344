-- claim_fair_round: many picks of the fair order in one statement, where the head of the order
-- says exactly what picking one item at a time would choose (plan_fair_round says how far).
-- claim_items calls it, set after set, for the run of its fair requests (no strategy) that
-- share a service and querier, when the service has one component with claimable work and one
-- tenant competing for it: then the order is that tenant's users alone. The picks' items are
-- leased in one statement, which hands the counters' changes to count_claims. The caller takes
-- the rest one pick at a time; a tenant with a cap or a rate limit it takes one pick at a time
-- from the start (admit_tenant).
--
-- Arguments: the service, querier and component; claim_items' request arrays (request i the
-- i-th of each), how many items each was served so far; the lease in ms; the batch's clocks.
-- Answer: a row per pick, in order, with the request its item went to; id is NULL for a pick
-- whose item another transaction held after all. more, on every row: the set took all it
-- chose, and fewer than the run wants, so another set may take the next; clocks, the batch's
-- clocks after the set's turns (take_turns).
-- Locks: as claim_items' picks take them: the head's users rows (SKIP LOCKED), the items (SKIP
-- LOCKED), count_claims' counter rows, jobs. Only the one-tenant order is read: no tenant row.

CREATE OR REPLACE FUNCTION claim_fair_round(
    p_service text,
    p_querier text,
    p_component text,
    p_services text[],
    p_queriers text[],
    p_strategies jsonb[],
    p_maxes integer[],
    p_served integer[],
    p_workers integer[],
    p_tokens bigint[],
    p_lease_ms bigint,
    p_clocks jsonb
)
RETURNS TABLE (
    request integer, username text, tenant text, id bigint, job_id uuid, step_index integer,
    payload jsonb, inputs jsonb, attempt integer, lease_expires_at timestamptz,
    traceparent text, more boolean, clocks jsonb
)
LANGUAGE plpgsql
-- Planned once: a plan made afresh for each set would cost more than the set saves. Never
-- compiled: the plan cannot see how many items each user takes, so its estimate can pass
-- jit_above_cost, and compiling would cost many times what the set does. Never a scan: the plan
-- expects one row where a set has one per user, so against a small table (a thousand users) a
-- scan looks cheaper than the probes, and the session would scan it per user for as long as it
-- lives. plan_fair_round is set the same way.
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $round$
#variable_conflict use_column
DECLARE
    v_at timestamptz := clock_timestamp();
    -- The one tenant, the head of its users' order, and that order's clock (turn_start).
    v_tenant text; v_tenant_policed boolean; v_least bigint; v_tier smallint;
    v_first_lags boolean; v_clock bigint;
    -- The request of each item the run still wants, in the order they are served.
    v_slots integer[];
BEGIN
    v_slots := ARRAY(SELECT r.i
                       FROM unnest(p_services, p_queriers, p_strategies)
                            WITH ORDINALITY AS r(service, querier, strategy, i)
                      CROSS JOIN LATERAL generate_series(1, p_maxes[r.i] - p_served[r.i]) g
                      WHERE (r.service, r.querier) = (p_service, p_querier)
                        AND r.strategy IS NULL
                      ORDER BY r.i, g);
    IF cardinality(v_slots) = 0 THEN
        RETURN;
    END IF;
    -- The one active tenant queue, read as the one-at-a-time claim reads the tenants, and in the
    -- same statement the head of its users' order: its share, the least work in progress in the
    -- order. No user further ahead of it than there are items wanted can be reached, and bounding
    -- the head by that keeps its read a short range of the order's index: the plan, made once,
    -- cannot see the LIMIT. A first row that lags its user would end the set before its first
    -- pick: then the caller's single claims, which bring such rows level, go on at once. (Read
    -- without the user's lock: the set checks again under it.)
    SELECT tq.tenant, t.max_running > 0 OR t.rate_per_second > 0, first.share, first.tier,
           first.lags,
           -- Its users' order's clock, as fair_clock reads it, whose call would cost more.
           coalesce(carried_fair_clock(p_clocks, p_service, p_component, tq.tenant),
                    (SELECT fc.clock FROM fair_clocks fc
                      WHERE (fc.service, fc.component, fc.tenant)
                            = (p_service, p_component, tq.tenant)), 0)
      INTO v_tenant, v_tenant_policed, v_least, v_tier, v_first_lags, v_clock
      FROM tenant_queues tq
      JOIN tenants t ON t.tenant = tq.tenant
      LEFT JOIN LATERAL (
           SELECT su.share, su.tier,
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
    WITH chosen AS MATERIALIZED (
        SELECT *
          FROM plan_fair_round(p_service, p_component, v_tenant, v_tier, v_least, v_slots,
                               v_at)
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
               c.pass, c.fresh, c.weight,
               (SELECT j.traceparent FROM jobs j WHERE j.job_id = wi.job_id) AS traceparent
    ), turns AS (
        -- The picks' turns, taken in order as single claims would take them.
        SELECT t.passes, t.clock, picks.seqs,
               carry_fair_clock(p_clocks, p_service, p_component, v_tenant, t.clock) AS clocks
          FROM (SELECT array_agg(i.seq ORDER BY i.seq) AS seqs,
                       array_agg(i.username ORDER BY i.seq) AS usernames,
                       array_agg(i.pass ORDER BY i.seq) AS passes,
                       array_agg(i.fresh ORDER BY i.seq) AS fresh,
                       array_agg(i.weight ORDER BY i.seq) AS weights
                  FROM item i) picks
         CROSS JOIN LATERAL take_turns(v_clock, picks.usernames, picks.passes, picks.fresh,
                                       picks.weights) t
    ), counted AS (
        -- The counters' changes, a user's picks summed (each user takes items of one step).
        SELECT count_claims(p_service, p_component, v_tenant, array_agg(cl.username),
                            array_agg(cl.job_id), array_agg(cl.step_index), array_agg(cl.items),
                            array_agg(cl.last_at), array_agg(cl.last_id),
                            array_agg(cl.only_step), '{}', false, false, array_agg(cl.pass),
                            (SELECT t.clock FROM turns t), NULL) AS counts
          FROM (SELECT i.username, i.job_id, i.step_index, count(*)::integer AS items,
                       max(i.at) AS last_at, max(i.id) AS last_id,
                       bool_and(i.only_step) AS only_step, max(taken.pass) AS pass
                  FROM item i
                  JOIN (SELECT unnest(t.seqs) AS seq, unnest(t.passes) AS pass
                          FROM turns t) taken ON taken.seq = i.seq
                 GROUP BY i.username, i.job_id, i.step_index) cl
    ), started AS (
        -- Only a step never worked before can belong to a job not yet running.
        UPDATE jobs j
           SET status = 'running', updated_at = now()
         WHERE j.job_id = ANY (ARRAY(SELECT listed.job_id FROM item listed
                                      WHERE listed.first_claim))
           AND j.status = 'accepted'
    )
    SELECT c.request, c.username, v_tenant, i.id, i.job_id, i.step_index, i.payload,
           i.inputs, i.attempt, i.lease_expires_at, i.traceparent,
           count(i.id) OVER () > 0 AND count(i.id) OVER () = count(*) OVER ()
               AND count(*) OVER () < cardinality(v_slots),
           t.clocks
      FROM chosen c
      LEFT JOIN item i ON i.seq = c.seq
     -- Referenced, so that the counters move once every pick is leased.
     CROSS JOIN counted
     CROSS JOIN turns t
     ORDER BY c.seq;
END;
$round$;
