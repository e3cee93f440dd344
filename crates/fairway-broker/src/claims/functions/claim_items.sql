-- claim_items: the claim. Serves a batch of workers' requests in one transaction: request i
-- asks for up to p_maxes[i] items of service p_services[i] for worker slot p_workers[i] of
-- querier p_queriers[i], each leased for p_lease_ms. Items are chosen one at a time, in request
-- order, each by the fair order as the counters the ones before it moved leave it; where the
-- next several choices are known to be the head of the order, they are made as one set
-- (claim_fair_round), which chooses the same items. A function
-- rather than one statement because the choice is a search with early exits: each level is a
-- small index probe that runs only when the level above needs it, and the whole batch is still
-- one round trip.
--
-- The fair order (docs/design.md tells it at length):
-- 1. Component: those with claimable work for the service (an active tenant queue), in name
--    order, visited from the worker's slot modulo their number, wrapping, until one yields a
--    user.
-- 2. Tenant, within the component: active tenant_queues rows by work in progress divided by
--    the tenant's weight (share), then least recently worked, leaving out tenants sharded to
--    other queriers. A tenant with a cap or a rate limit is admitted item by item under its
--    row's lock (admit_tenant), and passed over for the rest of the batch when full.
-- 3. User, within the tenant: the first in service_users_fair_order (least work in progress
--    over all services divided by the user's weight, then least recently worked) whose users
--    row is free, among the users in the order: one at its cap or with an empty bucket has
--    left the index (in_order) until an ending or its due time puts it back. SKIP LOCKED sends
--    a concurrent claimer on to the next user, tenant or component instead of queueing. A
--    queue row's copies of the user's counts and policy may lag them, never lead: a row found
--    lagging at the head is brought level (with the lagging rows of free users just behind it)
--    and the order read again, so the first level row is the user that truly goes first.
-- 4. Down the user's actor tree: a node's best child actor goes before the node's own jobs when
--    it has less work in progress, or as much and was worked less recently (never worked counts
--    as longest ago). Skipped when none of the user's ready work is under an actor.
-- 5. The node's best job step (synchronous first, then the job's higher priority, then least
--    recently worked), then the step's lowest ready item of the component, read from the
--    step's ready_from.
-- 6. The item is leased, and the step's user_work row, the users row, the claimed queue's
--    service_users row and the path's actor_queues rows move in this same transaction; the
--    tenant's row too while other tenants compete for the component.
-- The membership check, the querier's touch, the list of components and whether tenants
-- compete in each are made once per (service, querier) in the batch, not per item: a rival
-- tenant that arrives meanwhile is counted from the next batch on, and the reaper's recount
-- covers the claims in between, as it covers a tenant that was alone. The lease records the
-- claiming token (p_tokens[i]), which alone may then report on the attempt (finish_items,
-- extend_lease).
--
-- A request with a strategy (p_strategies[i], README "Claim strategies") replaces 2 to 5: its
-- attempts in turn, each reading claimable_steps (or claimable_step_metadata, under a
-- select_only filter) in the attempt's order from the head of that order's index: oldest and
-- newest by the job's submission order, priority by the job's priority then submission order,
-- random from a random cut of a hash fixed per step, wrapping. `fair` under a filter or a cap
-- is read in submission order: the fair order cannot be filtered without walking users. Each
-- step met is checked against the attempt's other filters, the querier's shards and its caps
-- by the logged running counts; the first that passes and whose user is free is taken, at its
-- lowest ready item, as 6 takes the fair order's. Under a hard cap (max_simultaneous) the
-- value's strategy_running row is locked (SKIP LOCKED) and its count read afresh first, so
-- that no two transactions admit against the same count; a value found capped is passed over
-- for the rest of the transaction. At most 256 steps are read per attempt, so that steps held
-- or capped at the head of an order cannot make a claim walk the backlog.
--
-- Answer: a row per claimed item, with its job's traceparent, tagged with its request's index
-- (1-based). A request that got
-- nothing has one row with id NULL and querier_state saying why: NULL, the querier is not a
-- member yet (the broker has it join, then asks again); 'shutting_down'; 'active', nothing
-- claimable was free (none exists, or every user with it is held by another transaction).
-- For a strategy, passed_over then says whether a step was passed over because another
-- transaction held its user or its capped value's row (so that looking again may find it).
--
-- A request of a service with a cap or a rate limit takes at most what admit_services allows
-- it, and the items taken are billed to the service's bucket last (charge_services). A user's
-- bucket is billed with its users row, a tenant's with its tenants row, item by item. A
-- strategy's step whose user is at its cap or out of tokens is passed over, as is one of a
-- full tenant. A request that got nothing because of a policy says so in limited.
--
-- Each batch puts back into the order the users whose buckets have come due, before its first
-- item.
--
-- Locks, in the order every transaction keeps: the batch's services' advisory claim locks, in
-- service order, waited for (a service's claims take turns across brokers); the
-- service_policies rows of capped or limited services, in service order (admit_services); the
-- tenant rows with logged changes, folded next (fold_tenant_running_changes); the users rows
-- whose buckets came due (SKIP LOCKED); then
-- per item the user's users row (SKIP LOCKED), a policed tenant's tenants row (SKIP LOCKED), a
-- capped value's strategy_running row (SKIP LOCKED), the item, the counter rows; the tenant's
-- row last. A claim waits for a tenant row only when it
-- sorts after every tenant row the transaction holds, the order apply_tenant_deltas takes them
-- in, so that waits cannot form a cycle; otherwise it takes the row without waiting or passes
-- the tenant over for the rest of the batch. A chosen user whose place in the order changed
-- since the statement's snapshot, whose queue row lagged, or whose last item went elsewhere in
-- between, is looked for again at once, up to sixteen times.

CREATE OR REPLACE FUNCTION claim_items(
    p_services text[],
    p_queriers text[],
    p_workers integer[],
    p_maxes integer[],
    p_lease_ms bigint,
    -- An active querier's last_seen moves at most once per this many milliseconds.
    p_touch_ms bigint,
    -- Request i's strategy (NULL: the fair order), as the broker normalises it: a list of
    -- attempts, each {"order", "only": [{"key", "value"}], "caps": [{"key", "max", "hard"}]}.
    p_strategies jsonb[],
    -- Request i's token (tokens.id), recorded on each item it claims as claimed_by, so that
    -- only that token may report on the attempt; NULL (or no array): claimed without a token.
    p_tokens bigint[] DEFAULT NULL
)
RETURNS TABLE (
    request integer,
    querier_state text,
    username text,
    id bigint,
    job_id uuid,
    step_index integer,
    component text,
    payload jsonb,
    inputs jsonb,
    attempt integer,
    lease_expires_at timestamptz,
    tenant text,
    actor text[],
    passed_over boolean,
    traceparent text,
    -- Why a request of a capped or rate-limited service got fewer items than it asked for:
    -- 'cap' or 'rate' (admit_services); for a rate, in how many milliseconds one is due.
    limited text,
    retry_ms bigint
)
LANGUAGE plpgsql
AS $claims$
#variable_conflict use_column
DECLARE
    v_service text;
    v_querier text;
    v_worker integer;
    i integer;
    -- The service and querier whose membership and components were last looked up.
    v_checked_service text;
    v_checked_querier text;
    v_components text[];
    -- Whether two or more tenants compete for each of v_components.
    v_contested boolean[];
    v_count integer;
    v_claimed integer;
    -- The greatest (service, component, tenant) key of the tenant rows this transaction holds.
    v_held_service text;
    v_held_component text;
    v_held_tenant text;
    v_component text;
    v_pick record;
    v_path text[];
    v_own record;
    v_child record;
    v_item record;
    v_at timestamptz;
    v_counted boolean;
    -- Tenant queues whose rows other transactions held when this one could not wait for them.
    v_passed text[] := '{}';
    -- A strategy's state: its attempts, the one being read, and the step it chose.
    v_attempts jsonb;
    v_attempt jsonb;
    v_order text;
    v_only jsonb;
    v_key text;
    v_value jsonb;
    v_cut integer;
    v_cursor refcursor;
    v_candidate record;
    v_cap record;
    -- Capped values met by this transaction's strategies, as ROW(service, key, value, max)::text.
    v_capped text[] := '{}';
    -- The jobs met capped, as ROW(service, job_id, the attempt's caps)::text.
    v_capped_jobs text[] := '{}';
    v_capped_job text;
    v_newly_capped text[];
    v_capped_count bigint;
    v_running integer;
    v_chosen boolean;
    v_use_fair boolean;
    v_step_job uuid;
    v_step_index integer;
    -- The requests in the order they are served, and how many items each got from sets.
    v_in_order integer[];
    v_served integer[];
    -- The items a run of requests served by sets (claim_fair_round) still wants.
    v_slots integer[];
    v_set record;
    v_set_claimed integer;
    v_set_missed boolean;
    -- Service policies: why each request was cut, and how many items each took, to bill
    -- (all NULL in a batch no policy touches).
    v_policed boolean;
    -- Whether some user's bucket has come due, so that its rows go back into the order.
    v_users_due boolean;
    -- Whether running-count changes of competing tenants are logged, to fold first.
    v_logged boolean;
    -- Whether the querier's last_seen is older than p_touch_ms.
    v_stale boolean;
    -- Whether the services' claim locks are held (always, once asked).
    v_locked boolean;
    v_admitted record;
    v_user record;
    v_limited text[];
    v_retry_ms bigint[];
    v_taken integer[];
BEGIN
    -- What the batch must do before its first item, asked in one statement: a batch of
    -- services without a policy, with no user's bucket come due and no tenant's change logged
    -- pays only this. The requests are served in (service, querier) order, so that the
    -- membership check and the component list are made once per querier and service. First,
    -- the services' claim locks, in name order: claims for a service take turns, in every
    -- broker, rather than race for the head of the same order.
    SELECT (SELECT count(*)
              FROM (SELECT pg_advisory_xact_lock(hashtextextended('fairway claims ' || s.service,
                                                                  0))
                      FROM (SELECT DISTINCT r.service
                              FROM unnest(p_services) AS r(service)) s
                     ORDER BY s.service) locked) IS NOT NULL,
           EXISTS (SELECT 1
                     FROM service_policies sp
                    WHERE sp.service = ANY (p_services)
                      AND (sp.max_running > 0 OR sp.rate_per_second > 0)),
           EXISTS (SELECT 1 FROM users u WHERE u.throttled_until <= now()),
           EXISTS (SELECT 1 FROM tenant_running_changes),
           ARRAY(SELECT r.i
                   FROM unnest(p_services, p_queriers) WITH ORDINALITY AS r(service, querier, i)
                  ORDER BY r.service, r.querier, r.i)
      INTO v_locked, v_policed, v_users_due, v_logged, v_in_order;
    -- Capped and rate-limited services first, before anything else is locked: each request's
    -- max is cut to what its service's policy still allows (admit_services).
    IF v_policed THEN
        v_taken := array_fill(0, ARRAY[cardinality(p_services)]);
        FOR v_admitted IN SELECT * FROM admit_services(p_services, p_maxes) LOOP
            p_maxes[v_admitted.request] := v_admitted.allowed;
            v_limited[v_admitted.request] := v_admitted.limited;
            v_retry_ms[v_admitted.request] := v_admitted.retry_ms;
        END LOOP;
    END IF;
    limited := NULL;
    retry_ms := NULL;

    -- The running-count changes logged since the last batch, first: the tenant order below
    -- reads the counts. The rows folded are held from here on, so the greatest is the bound
    -- below which this transaction's claims may not wait. Only tenants that compete log
    -- changes, so where none do there is nothing to fold.
    IF v_logged THEN
        SELECT f.service, f.component, f.tenant
          INTO v_held_service, v_held_component, v_held_tenant
          FROM fold_tenant_running_changes() f;
    END IF;

    -- Users whose rate limit's next item has come due go back into the fair order: their rows
    -- there left it when their buckets emptied (see the users update below).
    IF v_users_due THEN
        WITH due AS (
            SELECT u.username
              FROM users u
             WHERE u.throttled_until <= now()
               FOR NO KEY UPDATE SKIP LOCKED
        ), released AS (
            UPDATE users u
               SET throttled_until = NULL
              FROM due
             WHERE u.username = due.username
        )
        UPDATE service_users su
           SET throttled = false
          FROM due
         WHERE su.username = due.username
           AND su.throttled;
    END IF;

    v_served := array_fill(0, ARRAY[cardinality(v_in_order)]);
    FOREACH i IN ARRAY v_in_order LOOP
        v_service := p_services[i];
        v_querier := p_queriers[i];
        IF (v_service, v_querier) IS DISTINCT FROM (v_checked_service, v_checked_querier) THEN
            v_checked_service := v_service;
            v_checked_querier := v_querier;
            -- The querier's membership, whether its last_seen is due to move, and (1.) the
            -- components with claimable work, by a skip scan over tenant_queues, one probe per
            -- component: one statement.
            SELECT q.state::text,
                   q.state = 'active'
                       AND q.last_seen < now() - p_touch_ms * interval '1 millisecond',
                   listed.components,
                   listed.contested
              INTO querier_state, v_stale, v_components, v_contested
              FROM (SELECT v_querier AS querier) asked
              LEFT JOIN queriers q ON q.querier = asked.querier
             CROSS JOIN LATERAL (
                   WITH RECURSIVE components AS (
                       (SELECT tq.component
                          FROM tenant_queues tq
                         WHERE tq.service = v_service
                           AND tq.active
                         ORDER BY tq.component
                         LIMIT 1)
                       UNION ALL
                       SELECT (SELECT tq.component
                                 FROM tenant_queues tq
                                WHERE tq.service = v_service
                                  AND tq.active
                                  AND tq.component > c.component
                                ORDER BY tq.component
                                LIMIT 1)
                         FROM components c
                        WHERE c.component IS NOT NULL
                   )
                   SELECT array_agg(c.component ORDER BY c.component) AS components,
                          -- A second active tenant, read in primary-key order so that the
                          -- probe stops there.
                          array_agg((SELECT tq.tenant
                                       FROM tenant_queues tq
                                      WHERE tq.service = v_service
                                        AND tq.component = c.component
                                        AND tq.active
                                      ORDER BY tq.service, tq.component, tq.tenant
                                     OFFSET 1
                                      LIMIT 1) IS NOT NULL
                                    ORDER BY c.component) AS contested
                     FROM components c
                    WHERE c.component IS NOT NULL
                   ) listed;
            -- The row is shared by all of the querier's workers: one of them moves it, the rest
            -- skip. A querier shutting down is not heard: its 410s must not keep it from being
            -- forgotten (retire_queriers.sql).
            IF v_stale THEN
                PERFORM 1
                   FROM queriers q
                  WHERE q.querier = v_querier
                    AND q.state = 'active'
                    AND q.last_seen < now() - p_touch_ms * interval '1 millisecond'
                    FOR NO KEY UPDATE SKIP LOCKED;
                IF FOUND THEN
                    UPDATE queriers q SET last_seen = now() WHERE q.querier = v_querier;
                END IF;
            END IF;
            v_count := coalesce(cardinality(v_components), 0);

            -- Where one tenant is all the order holds, the fair requests of this service and
            -- querier take their items as sets of the order's head for as long as that is
            -- exact (see claim_fair_round), then go on one item at a time below.
            IF querier_state = 'active' AND v_count = 1 AND NOT v_contested[1] THEN
                LOOP
                    -- The request of each item the run (the fair requests of this service and
                    -- querier) still wants, in the order served.
                    v_slots := ARRAY(SELECT r.i
                                       FROM unnest(p_services, p_queriers, p_strategies)
                                            WITH ORDINALITY AS r(service, querier, strategy, i)
                                      CROSS JOIN LATERAL
                                            generate_series(1, p_maxes[r.i] - v_served[r.i]) g
                                      WHERE (r.service, r.querier) = (v_service, v_querier)
                                        AND r.strategy IS NULL
                                      ORDER BY r.i, g);
                    EXIT WHEN cardinality(v_slots) = 0;
                    v_set_claimed := 0;
                    v_set_missed := false;
                    FOR v_set IN
                        SELECT *
                          FROM claim_fair_round(v_service, v_querier, v_components[1], v_slots,
                                                p_workers, p_tokens, p_lease_ms)
                    LOOP
                        IF v_set.id IS NULL THEN
                            v_set_missed := true;
                            CONTINUE;
                        END IF;
                        v_served[v_set.request] := v_served[v_set.request] + 1;
                        v_set_claimed := v_set_claimed + 1;
                        request := v_set.request;
                        username := v_set.username;
                        id := v_set.id;
                        job_id := v_set.job_id;
                        step_index := v_set.step_index;
                        component := v_components[1];
                        payload := v_set.payload;
                        inputs := v_set.inputs;
                        attempt := v_set.attempt;
                        lease_expires_at := v_set.lease_expires_at;
                        tenant := v_set.tenant;
                        actor := '{}';
                        passed_over := false;
                        traceparent := v_set.traceparent;
                        limited := v_limited[v_set.request];
                        retry_ms := v_retry_ms[v_set.request];
                        RETURN NEXT;
                    END LOOP;
                    -- A set that took every item wanted leaves none to look for again.
                    EXIT WHEN v_set_claimed IN (0, cardinality(v_slots)) OR v_set_missed;
                END LOOP;
            END IF;
        END IF;

        request := i;
        v_worker := p_workers[i];
        v_claimed := v_served[i];
        username := NULL;
        id := NULL;
        job_id := NULL;
        step_index := NULL;
        component := NULL;
        payload := NULL;
        inputs := NULL;
        attempt := NULL;
        lease_expires_at := NULL;
        tenant := NULL;
        actor := NULL;
        passed_over := false;
        traceparent := NULL;
        limited := v_limited[i];
        retry_ms := v_retry_ms[i];
        v_attempts := p_strategies[i];

        IF querier_state IS DISTINCT FROM 'active' THEN
            RETURN NEXT;
            CONTINUE;
        END IF;

        <<items>>
        WHILE v_claimed < p_maxes[i] AND v_count > 0 LOOP
            <<looks>>
            FOR look IN 1 .. 16 LOOP
                v_step_job := NULL;
                v_use_fair := v_attempts IS NULL;
                IF NOT v_use_fair THEN
                    -- A strategy: its attempts in turn, each reading the claimable steps in
                    -- its order from the head of an index, until one yields a step.
                    v_chosen := false;
                    <<attempts>>
                    FOR attempt_no IN 0 .. jsonb_array_length(v_attempts) - 1 LOOP
                        v_attempt := v_attempts -> attempt_no;
                        v_order := v_attempt ->> 'order';
                        -- The fair order itself, unfiltered: the fair claim below.
                        IF v_order = 'fair' AND v_attempt -> 'only' = '[]'
                           AND v_attempt -> 'caps' = '[]'
                        THEN
                            v_use_fair := true;
                            EXIT attempts;
                        END IF;
                        -- The first select_only filter picks the index; the rest are checked
                        -- per step below.
                        v_only := v_attempt -> 'only' -> 0;
                        v_cut := (floor(random() * 4294967296) - 2147483648)::integer;
                        IF v_only IS NULL THEN
                            IF v_order = 'newest' THEN
                                OPEN v_cursor FOR
                                    SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                                      FROM claimable_steps cs
                                     WHERE cs.service = v_service
                                     ORDER BY cs.seq DESC
                                     LIMIT 256;
                            ELSIF v_order = 'priority' THEN
                                OPEN v_cursor FOR
                                    SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                                      FROM claimable_steps cs
                                     WHERE cs.service = v_service
                                     ORDER BY cs.priority DESC, cs.seq
                                     LIMIT 256;
                            ELSIF v_order = 'random' THEN
                                -- Cut the deck at a random place, and wrap. (The cut as a
                                -- subquery, so that no plan is made for one cut's row count.)
                                OPEN v_cursor FOR
                                    (SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                                       FROM claimable_steps cs
                                      WHERE cs.service = v_service
                                        AND cs.shuffle >= (SELECT v_cut)
                                      ORDER BY cs.shuffle
                                      LIMIT 256)
                                    UNION ALL
                                    (SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                                       FROM claimable_steps cs
                                      WHERE cs.service = v_service
                                        AND cs.shuffle < (SELECT v_cut)
                                      ORDER BY cs.shuffle
                                      LIMIT 256)
                                    LIMIT 256;
                            ELSE
                                -- oldest, and fair under a filter or a cap (see the header).
                                OPEN v_cursor FOR
                                    SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                                      FROM claimable_steps cs
                                     WHERE cs.service = v_service
                                     ORDER BY cs.seq
                                     LIMIT 256;
                            END IF;
                        ELSE
                            v_key := v_only ->> 'key';
                            v_value := v_only -> 'value';
                            IF v_order = 'newest' THEN
                                OPEN v_cursor FOR
                                    SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                                      FROM claimable_step_metadata cm
                                     WHERE (cm.service, cm.key, cm.value)
                                           = (v_service, v_key, v_value)
                                     ORDER BY cm.seq DESC
                                     LIMIT 256;
                            ELSIF v_order = 'priority' THEN
                                OPEN v_cursor FOR
                                    SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                                      FROM claimable_step_metadata cm
                                     WHERE (cm.service, cm.key, cm.value)
                                           = (v_service, v_key, v_value)
                                     ORDER BY cm.priority DESC, cm.seq
                                     LIMIT 256;
                            ELSIF v_order = 'random' THEN
                                OPEN v_cursor FOR
                                    (SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                                       FROM claimable_step_metadata cm
                                      WHERE (cm.service, cm.key, cm.value)
                                            = (v_service, v_key, v_value)
                                        AND cm.shuffle >= (SELECT v_cut)
                                      ORDER BY cm.shuffle
                                      LIMIT 256)
                                    UNION ALL
                                    (SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                                       FROM claimable_step_metadata cm
                                      WHERE (cm.service, cm.key, cm.value)
                                            = (v_service, v_key, v_value)
                                        AND cm.shuffle < (SELECT v_cut)
                                      ORDER BY cm.shuffle
                                      LIMIT 256)
                                    LIMIT 256;
                            ELSE
                                OPEN v_cursor FOR
                                    SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                                      FROM claimable_step_metadata cm
                                     WHERE (cm.service, cm.key, cm.value)
                                           = (v_service, v_key, v_value)
                                     ORDER BY cm.seq
                                     LIMIT 256;
                            END IF;
                        END IF;
                        -- (Each order reads at most 256 steps, the bound below; saying so lets
                        -- the planner read them from the head of the order's index.)
                        <<candidates>>
                        FOR seen IN 1 .. 256 LOOP
                            FETCH v_cursor INTO v_candidate;
                            EXIT candidates WHEN NOT FOUND;
                            -- Every cap, by the running counts as logged so far (exact for hard
                            -- caps only once locked, below). A value found capped is passed over
                            -- for the rest of this transaction: its own claims only add to the
                            -- count, and capacity that others free is seen by the next
                            -- transaction. The job found capped is passed over with no
                            -- statement at all, since every claim of the batch meets it again
                            -- at the head of the order.
                            IF v_attempt -> 'caps' <> '[]' THEN
                                v_capped_job := ROW(v_service, v_candidate.job_id,
                                                    v_attempt -> 'caps')::text;
                                CONTINUE candidates WHEN v_capped_job = ANY (v_capped_jobs);
                                SELECT array_agg(c.capped) FILTER (WHERE c.capped <> ALL (v_capped)),
                                       count(*)
                                  INTO v_newly_capped, v_capped_count
                                  FROM (SELECT m.key, m.value, r.running,
                                               (cap ->> 'max')::integer AS max,
                                               ROW(v_service, m.key, m.value, cap ->> 'max')::text
                                                   AS capped
                                          FROM jsonb_array_elements(v_attempt -> 'caps') cap
                                          JOIN job_metadata m
                                            ON (m.job_id, m.key)
                                               = (v_candidate.job_id, cap ->> 'key')
                                          JOIN strategy_running r
                                            ON (r.service, r.key, r.value)
                                               = (v_service, m.key, m.value)) c
                                 WHERE c.capped = ANY (v_capped)
                                    OR c.running
                                       + coalesce((SELECT sum(l.running)
                                                     FROM strategy_running_changes l
                                                    WHERE (l.service, l.key, l.value)
                                                          = (v_service, c.key, c.value)),
                                                  0)
                                       >= c.max;
                                IF v_capped_count > 0 THEN
                                    v_capped := v_capped || coalesce(v_newly_capped, '{}');
                                    v_capped_jobs := v_capped_jobs || v_capped_job;
                                    CONTINUE candidates;
                                END IF;
                            END IF;
                            -- The step's other filters, the querier's shards, a tenant passed
                            -- over.
                            SELECT uw.username, uw.tenant, false AS stale, 0 AS ready_count,
                                   0 AS local_ready, 0 AS local_running,
                                   NULL::timestamptz AS local_last_worked, uw.actor,
                                   t.max_running > 0 OR t.rate_per_second > 0 AS tenant_policed
                              INTO v_pick
                              FROM user_work uw
                              JOIN tenants t ON t.tenant = uw.tenant
                             WHERE (uw.job_id, uw.step_index, uw.component)
                                   = (v_candidate.job_id, v_candidate.step_index,
                                      v_candidate.component)
                               AND uw.ready_count > 0
                               AND NOT uw.paused
                               AND ROW(v_service, uw.component, uw.tenant)::text
                                   <> ALL (v_passed)
                               AND (NOT t.sharded
                                    OR (SELECT true
                                          FROM tenant_shards ts
                                         WHERE ts.tenant = uw.tenant
                                           AND ts.querier = v_querier))
                               AND NOT EXISTS (
                                       SELECT 1
                                         FROM jsonb_array_elements(v_attempt -> 'only') f
                                        WHERE NOT EXISTS (
                                                  SELECT 1
                                                    FROM job_metadata m
                                                   WHERE (m.job_id, m.key, m.value)
                                                         = (uw.job_id, f ->> 'key',
                                                            f -> 'value')));
                            CONTINUE candidates WHEN NOT FOUND;
                            SELECT u.max_running > 0 AND u.running_count >= u.max_running
                                       AS capped,
                                   u.throttled_until
                              INTO v_user
                              FROM users u
                             WHERE u.username = v_pick.username
                               FOR NO KEY UPDATE SKIP LOCKED;
                            IF NOT FOUND THEN
                                passed_over := true;
                                CONTINUE candidates;
                            END IF;
                            -- A user at its cap, or out of tokens until the batch that finds
                            -- its next item due, is passed over as the fair order leaves it out.
                            IF v_user.capped THEN
                                limited := 'cap';
                                CONTINUE candidates;
                            END IF;
                            IF v_user.throttled_until IS NOT NULL THEN
                                limited := 'rate';
                                retry_ms := least(retry_ms,
                                                  retry_ms_until(v_user.throttled_until));
                                CONTINUE candidates;
                            END IF;
                            -- Hard caps: the value's row locked (never waited for), then its
                            -- count read afresh, in a snapshot that holds every change logged
                            -- by the transactions that held the row before, and those this one
                            -- logged since.
                            FOR v_cap IN
                                SELECT c ->> 'key' AS key, (c ->> 'max')::integer AS max,
                                       m.value
                                  FROM jsonb_array_elements(v_attempt -> 'caps') c
                                  JOIN job_metadata m
                                    ON (m.job_id, m.key) = (v_candidate.job_id, c ->> 'key')
                                 WHERE (c ->> 'hard')::boolean
                            LOOP
                                IF NOT fold_strategy_running(v_service, v_cap.key, v_cap.value)
                                THEN
                                    passed_over := true;
                                    CONTINUE candidates;
                                END IF;
                                SELECT r.running
                                       + coalesce((SELECT sum(l.running)
                                                     FROM strategy_running_changes l
                                                    WHERE (l.service, l.key, l.value)
                                                          = (r.service, r.key, r.value)),
                                                  0)
                                  INTO v_running
                                  FROM strategy_running r
                                 WHERE (r.service, r.key, r.value)
                                       = (v_service, v_cap.key, v_cap.value);
                                IF v_running >= v_cap.max THEN
                                    v_capped := v_capped
                                                || ROW(v_service, v_cap.key, v_cap.value,
                                                       v_cap.max::text)::text;
                                    v_capped_jobs := v_capped_jobs || v_capped_job;
                                    CONTINUE candidates;
                                END IF;
                            END LOOP;
                            v_chosen := true;
                            EXIT candidates;
                        END LOOP;
                        CLOSE v_cursor;
                        EXIT attempts WHEN v_chosen;
                    END LOOP;
                    EXIT items WHEN NOT (v_chosen OR v_use_fair);
                    IF v_chosen THEN
                        v_component := v_candidate.component;
                        v_path := v_pick.actor;
                        v_step_job := v_candidate.job_id;
                        v_step_index := v_candidate.step_index;
                    END IF;
                END IF;
                IF v_use_fair THEN
                    -- 2 and 3: tenant, then user, with the user's own-jobs counts.
                    FOR turn IN 0 .. v_count - 1 LOOP
                        v_component := v_components[1 + (v_worker + turn) % v_count];
                        SELECT best.username, tq.tenant, best.stale, best.ready_count,
                               best.local_ready, best.local_running, best.local_last_worked,
                               t.max_running > 0 OR t.rate_per_second > 0 AS tenant_policed
                          INTO v_pick
                          FROM tenant_queues tq
                          JOIN tenants t ON t.tenant = tq.tenant
                         CROSS JOIN LATERAL (
                               SELECT u.username,
                                      (u.running_count, u.last_worked, u.weight, u.max_running,
                                       u.throttled_until IS NOT NULL)
                                          IS DISTINCT FROM (su.running_count, su.last_worked,
                                                            su.weight, su.max_running,
                                                            su.throttled) AS stale,
                                      su.ready_count, su.local_ready, su.local_running,
                                      su.local_last_worked
                                 FROM service_users su
                                 JOIN users u ON u.username = su.username
                                WHERE su.service = v_service
                                  AND su.component = tq.component
                                  AND su.tenant = tq.tenant
                                  AND su.in_order
                                  AND su.ready_count > 0
                                ORDER BY su.share, su.last_worked NULLS FIRST, su.username
                                LIMIT 1
                                  FOR NO KEY UPDATE OF u SKIP LOCKED
                               ) best
                         WHERE tq.service = v_service
                           AND tq.component = v_component
                           AND tq.active
                           AND ROW(tq.service, tq.component, tq.tenant)::text <> ALL (v_passed)
                           -- A scalar subquery, not EXISTS: it stays a primary-key probe per tenant.
                           AND (NOT t.sharded
                                OR (SELECT true
                                      FROM tenant_shards ts
                                     WHERE ts.tenant = tq.tenant
                                       AND ts.querier = v_querier))
                         ORDER BY tq.share, tq.last_worked NULLS FIRST, tq.tenant
                         LIMIT 1;
                        EXIT WHEN FOUND;
                    END LOOP;
                    -- Nothing free for this request: the rest of the batch may still find work.
                    EXIT items WHEN v_pick.username IS NULL;
                    IF v_pick.stale THEN
                        -- The row's copies lag the user's counts (claims move only the row
                        -- they claim from) or policy, so the user sorts later than the row
                        -- says, or is at its cap or out of tokens: bring it level, under the
                        -- user's lock the pick took, and look again. Where
                        -- users are claimed in several services, the rows just behind it
                        -- mostly lag too: those whose users are free are levelled with it.
                        UPDATE service_users su
                           SET running_count = u.running_count,
                               last_worked = u.last_worked,
                               weight = u.weight,
                               max_running = u.max_running,
                               throttled = u.throttled_until IS NOT NULL
                          FROM (SELECT h.username
                                  FROM (SELECT l.username, l.running_count, l.last_worked,
                                               l.weight, l.max_running, l.throttled
                                          FROM service_users l
                                         WHERE (l.service, l.component, l.tenant)
                                               = (v_service, v_component, v_pick.tenant)
                                           AND l.in_order
                                           AND l.ready_count > 0
                                         ORDER BY l.share, l.last_worked NULLS FIRST,
                                                  l.username
                                         LIMIT 16) h
                                 WHERE h.username = v_pick.username
                                    OR (SELECT (seen.running_count, seen.last_worked,
                                                seen.weight, seen.max_running,
                                                seen.throttled_until IS NOT NULL)
                                                   IS DISTINCT FROM (h.running_count,
                                                                     h.last_worked, h.weight,
                                                                     h.max_running,
                                                                     h.throttled)
                                          FROM users seen
                                         WHERE seen.username = h.username)) lagging
                          JOIN LATERAL (SELECT u.running_count, u.last_worked, u.weight,
                                               u.max_running, u.throttled_until
                                          FROM users u
                                         WHERE u.username = lagging.username
                                           FOR NO KEY UPDATE SKIP LOCKED) u ON true
                         WHERE (su.username, su.service, su.component, su.tenant)
                               = (lagging.username, v_service, v_component, v_pick.tenant);
                        CONTINUE looks;
                    END IF;
                END IF;

                -- A tenant with a cap or a rate limit: one more item must fit both, under the
                -- tenant's row lock (admit_tenant). Else the tenant is passed over for the rest
                -- of the batch, its other users with it.
                IF v_pick.tenant_policed THEN
                    SELECT * INTO v_admitted FROM admit_tenant(v_pick.tenant);
                    IF v_admitted.limited IS NOT NULL THEN
                        v_passed := v_passed || ROW(v_service, v_component, v_pick.tenant)::text;
                        IF v_admitted.limited <> 'held' THEN
                            limited := v_admitted.limited;
                            retry_ms := least(retry_ms, v_admitted.retry_ms);
                        END IF;
                        CONTINUE looks;
                    END IF;
                END IF;

                -- The tenant's row, kept while other tenants compete for the component,
                -- is written after the item, and waited for then only when its key sorts after
                -- every tenant row the transaction holds, the order in which everyone takes
                -- them, so that waits cannot form a cycle. Otherwise it is locked now without
                -- waiting; if another transaction (another broker's claims) holds it, the
                -- tenant is passed over for the rest of the batch, as a held user is.
                -- Whether tenants compete was read with the component list; a component a
                -- strategy found since is asked afresh.
                v_counted := coalesce(v_contested[array_position(v_components, v_component)],
                                      tenant_has_rivals(v_service, v_component, v_pick.tenant));
                IF v_counted AND v_held_tenant IS NOT NULL
                   AND (v_service, v_component, v_pick.tenant)
                       < (v_held_service, v_held_component, v_held_tenant)
                THEN
                    PERFORM 1
                       FROM tenant_queues tq
                      WHERE (tq.service, tq.component, tq.tenant)
                            = (v_service, v_component, v_pick.tenant)
                        FOR NO KEY UPDATE SKIP LOCKED;
                    IF NOT FOUND THEN
                        v_passed := v_passed || ROW(v_service, v_component, v_pick.tenant)::text;
                        CONTINUE looks;
                    END IF;
                END IF;

                -- 4. Down the actor tree, unless all of the user's ready work is its own. A
                -- strategy's step has its own path.
                IF v_step_job IS NULL THEN
                    v_path := '{}';
                END IF;
                v_own := v_pick;
                WHILE v_step_job IS NULL AND v_pick.ready_count > v_pick.local_ready LOOP
                    SELECT a.path, a.running_count, a.last_worked
                      INTO v_child
                      FROM actor_queues a
                     WHERE (a.username, a.service, a.component, a.tenant, a.parent)
                           = (v_pick.username, v_service, v_component, v_pick.tenant, v_path)
                       AND a.ready_count > 0
                     ORDER BY a.running_count, a.last_worked NULLS FIRST, a.path
                     LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    EXIT WHEN v_own.local_ready > 0
                          AND (v_child.running_count, coalesce(v_child.last_worked, '-infinity'))
                              >= (v_own.local_running,
                                  coalesce(v_own.local_last_worked, '-infinity'));
                    v_path := v_child.path;
                    SELECT a.local_ready, a.local_running, a.local_last_worked
                      INTO v_own
                      FROM actor_queues a
                     WHERE (a.username, a.service, a.component, a.tenant, a.path)
                           = (v_pick.username, v_service, v_component, v_pick.tenant, v_path);
                END LOOP;

                -- 5 and 6, in one statement: the node's best job step, its lowest ready item,
                -- leased, and the counters moved with it (nothing moves if no item was free).
                -- One instant for every row this claim touches.
                v_at := clock_timestamp();
                WITH step AS (
                    (SELECT uw.job_id, uw.step_index, uw.ready_from,
                            uw.last_worked IS NULL AS first_claim
                       FROM user_work uw
                      WHERE v_step_job IS NULL
                        AND uw.service = v_service
                        AND uw.component = v_component
                        AND uw.tenant = v_pick.tenant
                        AND uw.username = v_pick.username
                        AND uw.actor = v_path
                        AND uw.ready_count > 0
                        AND NOT uw.paused
                      ORDER BY uw.is_async, uw.priority DESC, uw.last_worked NULLS FIRST,
                               uw.job_id, uw.step_index
                      LIMIT 1)
                    UNION ALL
                    -- The step a strategy chose.
                    SELECT uw.job_id, uw.step_index, uw.ready_from,
                           uw.last_worked IS NULL AS first_claim
                      FROM user_work uw
                     WHERE (uw.job_id, uw.step_index, uw.component)
                           = (v_step_job, v_step_index, v_component)
                       AND uw.ready_count > 0
                       AND NOT uw.paused
                ), item AS (
                    UPDATE work_items wi
                       SET status = 'running',
                           attempt = wi.attempt + 1,
                           lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
                           querier = v_querier,
                           worker = v_worker,
                           claimed_by = p_tokens[i],
                           updated_at = now()
                      FROM step
                     -- The ready items are read in index order, and only until the first
                     -- free one: from the step's ready_from, and from its start only if
                     -- nothing there was free (COALESCE runs the second probe only then).
                     WHERE wi.id = (SELECT coalesce(
                                               (SELECT ready.id
                                                  FROM work_items ready
                                                 WHERE ready.job_id = s.job_id
                                                   AND ready.step_index = s.step_index
                                                   AND ready.component = v_component
                                                   AND ready.status = 'ready'
                                                   AND ready.id >= s.ready_from
                                                 ORDER BY ready.id
                                                 LIMIT 1
                                                   FOR NO KEY UPDATE SKIP LOCKED),
                                               (SELECT ready.id
                                                  FROM work_items ready
                                                 WHERE ready.job_id = s.job_id
                                                   AND ready.step_index = s.step_index
                                                   AND ready.component = v_component
                                                   AND ready.status = 'ready'
                                                 ORDER BY ready.id
                                                 LIMIT 1
                                                   FOR NO KEY UPDATE SKIP LOCKED))
                                      FROM step s)
                 RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt,
                           wi.lease_expires_at, step.first_claim,
                           (SELECT j.traceparent FROM jobs j WHERE j.job_id = wi.job_id)
                               AS traceparent
                ), counted_step AS (
                    UPDATE user_work uw
                       SET ready_count = uw.ready_count - 1,
                           running_count = uw.running_count + 1,
                           last_worked = v_at,
                           ready_from = greatest(uw.ready_from, item.id)
                      FROM item
                     WHERE (uw.job_id, uw.step_index, uw.component)
                           = (item.job_id, item.step_index, v_component)
                ), user_counts AS (
                    -- A rate-limited user's bucket is billed; once empty, the user leaves the
                    -- fair order until its next item is due (throttled_until).
                    UPDATE users u
                       SET running_count = u.running_count + 1,
                           last_worked = v_at,
                           next_free = CASE WHEN u.rate_per_second > 0 THEN
                               bucket_charged(u.rate_per_second, u.next_free, 1) END,
                           throttled_until = CASE WHEN u.rate_per_second > 0 THEN
                               bucket_due(u.rate_per_second, u.burst,
                                          bucket_charged(u.rate_per_second, u.next_free, 1))
                           END
                     WHERE u.username = v_pick.username
                       AND EXISTS (SELECT 1 FROM item)
                 RETURNING u.running_count, u.throttled_until IS NOT NULL AS throttled
                ), queues AS (
                    -- Only the claimed queue's row: the user's rows in other queues keep
                    -- their copies, which now sort no later than the user does, and are
                    -- brought level when one of them comes to the head of its order.
                    UPDATE service_users su
                       SET running_count = uc.running_count,
                           last_worked = v_at,
                           throttled = uc.throttled,
                           ready_count = su.ready_count - 1,
                           local_ready = su.local_ready
                               - CASE WHEN v_path = '{}' THEN 1 ELSE 0 END,
                           local_running = su.local_running
                               + CASE WHEN v_path = '{}' THEN 1 ELSE 0 END,
                           local_last_worked = CASE WHEN v_path = '{}' THEN v_at
                                                    ELSE su.local_last_worked END
                      FROM user_counts uc
                     WHERE (su.username, su.service, su.component, su.tenant)
                           = (v_pick.username, v_service, v_component, v_pick.tenant)
                )
                SELECT item.id, item.job_id, item.step_index, item.payload, item.inputs,
                       item.attempt, item.lease_expires_at, item.first_claim, item.traceparent
                  INTO v_item
                  FROM item;
                -- No claimable step after all, or its last ready item went to another claim or
                -- a cancel in between: look again.
                CONTINUE looks WHEN v_item.id IS NULL;
                IF v_path <> '{}' THEN
                    UPDATE actor_queues a
                       SET ready_count = a.ready_count - 1,
                           running_count = a.running_count + 1,
                           last_worked = v_at,
                           local_ready = a.local_ready
                               - CASE WHEN a.path = v_path THEN 1 ELSE 0 END,
                           local_running = a.local_running
                               + CASE WHEN a.path = v_path THEN 1 ELSE 0 END,
                           local_last_worked = CASE WHEN a.path = v_path THEN v_at
                                                    ELSE a.local_last_worked END
                     WHERE (a.username, a.service, a.component, a.tenant)
                           = (v_pick.username, v_service, v_component, v_pick.tenant)
                       AND (a.path = v_path[1:1] OR a.path = v_path[1:2]
                            OR a.path = v_path[1:3]);
                END IF;
                IF v_pick.tenant_policed THEN
                    UPDATE tenants t
                       SET next_free = bucket_charged(t.rate_per_second, t.next_free, 1)
                     WHERE t.tenant = v_pick.tenant
                       AND t.rate_per_second > 0;
                END IF;
                -- The tenant's row (locked above when it had to be) takes the claim.
                IF v_counted THEN
                    UPDATE tenant_queues tq
                       SET running_count = tq.running_count + 1,
                           last_worked = v_at
                     WHERE (tq.service, tq.component, tq.tenant)
                           = (v_service, v_component, v_pick.tenant);
                    IF v_held_tenant IS NULL
                       OR (v_service, v_component, v_pick.tenant)
                          > (v_held_service, v_held_component, v_held_tenant)
                    THEN
                        v_held_service := v_service;
                        v_held_component := v_component;
                        v_held_tenant := v_pick.tenant;
                    END IF;
                END IF;
                -- Only a step never worked before can belong to a job not yet running.
                IF v_item.first_claim THEN
                    UPDATE jobs j
                       SET status = 'running', updated_at = now()
                     WHERE j.job_id = v_item.job_id
                       AND j.status = 'accepted';
                END IF;

                v_claimed := v_claimed + 1;
                username := v_pick.username;
                id := v_item.id;
                job_id := v_item.job_id;
                step_index := v_item.step_index;
                payload := v_item.payload;
                inputs := v_item.inputs;
                attempt := v_item.attempt;
                lease_expires_at := v_item.lease_expires_at;
                component := v_component;
                tenant := v_pick.tenant;
                actor := v_path;
                traceparent := v_item.traceparent;
                RETURN NEXT;
                CONTINUE items;
            END LOOP;
            -- Sixteen looks found the order moving under them: leave it to the broker's retry.
            EXIT items;
        END LOOP;
        IF v_policed THEN
            v_taken[i] := v_claimed;
        END IF;
        IF v_claimed = 0 THEN
            username := NULL;
            id := NULL;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF v_policed THEN
        PERFORM charge_services(p_services, v_taken);
    END IF;
END;
$claims$;
