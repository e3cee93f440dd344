-- A claim batch writes its claims' rows together, not claim by claim.
--
-- V6 moved the rows a claim touches in one statement per claim: the item, its step's
-- user_work row, the owner's users row and each of the owner's service_users rows. Each such
-- statement paid its start-up (opening four tables and their nine indexes, rebuilding each
-- table's CHECK expression from its stored form) and its finish for one claim: at 10 users a
-- claim cost 0.26 ms of the claim lane's time, at 1,000 users 0.24 ms.
--
-- Now a claim only chooses and locks: its user (as before), then its step and item, read and
-- locked but not yet written. record_claims, below, writes the pending claims in one
-- statement when the batch ends, or earlier when the order puts first a user already served
-- since the last write: that user's counters do not show its claim yet, so the choice is made
-- again after the write. A user not yet served that comes first comes first by exact counts
-- too (the served users' true places are only further back), so every claim goes where V6's
-- would have. Tenant and actor rows still move claim by claim: they are read before each
-- claim, and kept exact for it.
--
-- The rows come back from the write: attempt and lease are the item's as updated.

-- A claim chosen and locked, not yet written.
CREATE TYPE pending_claim AS (
    request     integer,
    id          bigint,
    querier     text,
    worker      integer,
    job_id      uuid,
    step_index  integer,
    service     text,
    component   text,
    tenant      text,
    username    text,
    actor       text[],
    claimed_at  timestamptz,
    first_claim boolean
);

-- Writes a batch's pending claims, each owner at most once among them: leases the items, and
-- moves each step's, owner's and queue's counters as V6's claim did. Returns claim_items' rows.
CREATE FUNCTION record_claims(p_claims pending_claim[], p_lease_ms bigint)
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
    actor text[]
)
LANGUAGE plpgsql
-- Its statement's custom plans came out cheaper than the generic one, each known array
-- shorter than the ten rows a generic plan assumes, so it was planned on every call: 0.27 ms,
-- as long as its writes. The generic plan is the same shape (a primary-key probe per claim).
SET plan_cache_mode = force_generic_plan
AS $record$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimed AS (
        SELECT c.* FROM unnest(p_claims) AS c
    ), items AS (
        UPDATE work_items wi
           SET status = 'running',
               attempt = wi.attempt + 1,
               lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
               querier = c.querier,
               worker = c.worker,
               updated_at = now()
          FROM claimed c
         WHERE wi.id = c.id
     RETURNING wi.id, wi.payload, wi.inputs, wi.attempt, wi.lease_expires_at
    ), steps AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count - 1,
               running_count = uw.running_count + 1,
               last_worked = c.claimed_at,
               ready_from = greatest(uw.ready_from, c.id)
          FROM claimed c
         WHERE (uw.job_id, uw.step_index, uw.component) = (c.job_id, c.step_index, c.component)
    ), owners AS (
        UPDATE users u
           SET running_count = u.running_count + 1,
               last_worked = c.claimed_at
          FROM claimed c
         WHERE u.username = c.username
     RETURNING u.username, u.running_count
    ), queues AS (
        -- Every row of the owner takes the new copies; the claimed queue's row also its counts,
        -- and its own-jobs counts when the job has no actor path.
        UPDATE service_users su
           SET running_count = o.running_count,
               last_worked = c.claimed_at,
               ready_count = su.ready_count
                   - CASE WHEN (su.service, su.component, su.tenant)
                               = (c.service, c.component, c.tenant)
                          THEN 1 ELSE 0 END,
               local_ready = su.local_ready
                   - CASE WHEN (su.service, su.component, su.tenant)
                               = (c.service, c.component, c.tenant)
                           AND c.actor = '{}'
                          THEN 1 ELSE 0 END,
               local_running = su.local_running
                   + CASE WHEN (su.service, su.component, su.tenant)
                               = (c.service, c.component, c.tenant)
                           AND c.actor = '{}'
                          THEN 1 ELSE 0 END,
               local_last_worked = CASE WHEN (su.service, su.component, su.tenant)
                                             = (c.service, c.component, c.tenant)
                                         AND c.actor = '{}'
                                        THEN c.claimed_at ELSE su.local_last_worked END
          FROM owners o
          JOIN claimed c ON c.username = o.username
         WHERE su.username = o.username
    ), started AS (
        -- Only a step never worked before can belong to a job not yet running.
        UPDATE jobs j
           SET status = 'running', updated_at = now()
          FROM claimed c
         WHERE c.first_claim
           AND j.job_id = c.job_id
           AND j.status = 'accepted'
    )
    SELECT c.request, 'active'::text, c.username, i.id, c.job_id, c.step_index, c.component,
           i.payload, i.inputs, i.attempt, i.lease_expires_at, c.tenant, c.actor
      FROM items i
      JOIN claimed c ON c.id = i.id;
END;
$record$;

-- V6's claim_items: each claim chosen and locked as before, its writes left to record_claims.
CREATE OR REPLACE FUNCTION claim_items(
    p_services text[],
    p_queriers text[],
    p_workers integer[],
    p_maxes integer[],
    p_lease_ms bigint,
    -- An active querier's last_seen moves at most once per this many milliseconds.
    p_touch_ms bigint
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
    actor text[]
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
    v_looks integer;
    -- Tenant queues whose rows other transactions held when this one could not wait for them.
    v_passed text[] := '{}';
    -- Claims chosen and locked but not yet written, and their owners, each at most once.
    v_pending pending_claim[] := '{}';
    v_served text[] := '{}';
BEGIN
    -- The running-count changes logged since the last batch, first: the tenant order below
    -- reads the counts. The rows folded are held from here on, so the greatest is the bound
    -- below which this transaction's claims may not wait.
    SELECT f.service, f.component, f.tenant
      INTO v_held_service, v_held_component, v_held_tenant
      FROM fold_tenant_running_changes() f;

    -- In (service, querier) order, so that the membership check and the component list are
    -- made once per querier and service in the batch.
    FOR i IN SELECT r.i
               FROM unnest(p_services, p_queriers) WITH ORDINALITY AS r(service, querier, i)
              ORDER BY r.service, r.querier, r.i
    LOOP
        request := i;
        v_service := p_services[i];
        v_querier := p_queriers[i];
        v_worker := p_workers[i];
        -- Only request and querier_state are ever set here: claims' rows come from
        -- record_claims, and a request that got nothing has a row with the rest NULL.
        v_claimed := 0;

        IF (v_service, v_querier) IS DISTINCT FROM (v_checked_service, v_checked_querier) THEN
            v_checked_service := v_service;
            v_checked_querier := v_querier;
            SELECT q.state::text INTO querier_state FROM queriers q WHERE q.querier = v_querier;
            -- The row is shared by all of the querier's workers: one of them moves it, the rest
            -- skip. (No row when the querier is not a member.)
            PERFORM 1
               FROM queriers q
              WHERE q.querier = v_querier
                AND q.last_seen < now() - p_touch_ms * interval '1 millisecond'
                FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE queriers q SET last_seen = now() WHERE q.querier = v_querier;
            END IF;

            -- 1. A skip scan over tenant_queues, one probe per component.
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
            SELECT array_agg(c.component ORDER BY c.component)
              INTO v_components
              FROM components c
             WHERE c.component IS NOT NULL;
            v_count := coalesce(cardinality(v_components), 0);
        END IF;
        IF querier_state IS DISTINCT FROM 'active' THEN
            RETURN NEXT;
            CONTINUE;
        END IF;

        <<items>>
        WHILE v_claimed < p_maxes[i] AND v_count > 0 LOOP
            v_looks := 0;
            <<looks>>
            WHILE v_looks < 4 LOOP
                v_looks := v_looks + 1;
                -- 2 and 3: tenant, then user, as in V2, with the user's own-jobs counts.
                FOR turn IN 0 .. v_count - 1 LOOP
                    v_component := v_components[1 + (v_worker + turn) % v_count];
                    SELECT best.username, tq.tenant, best.stale, best.ready_count,
                           best.local_ready, best.local_running, best.local_last_worked
                      INTO v_pick
                      FROM tenant_queues tq
                      JOIN tenants t ON t.tenant = tq.tenant
                     CROSS JOIN LATERAL (
                           SELECT u.username,
                                  u.running_count IS DISTINCT FROM su.running_count
                                      OR u.last_worked IS DISTINCT FROM su.last_worked AS stale,
                                  su.ready_count, su.local_ready, su.local_running,
                                  su.local_last_worked
                             FROM service_users su
                             JOIN users u ON u.username = su.username
                            WHERE su.service = v_service
                              AND su.component = tq.component
                              AND su.tenant = tq.tenant
                              AND su.ready_count > 0
                            ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
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
                     ORDER BY tq.running_count, tq.last_worked NULLS FIRST, tq.tenant
                     LIMIT 1;
                    EXIT WHEN FOUND;
                END LOOP;
                -- Nothing free for this request: the rest of the batch may still find work.
                EXIT items WHEN v_pick.username IS NULL;
                -- The order puts first a user this batch served since its last write, by counts
                -- that do not show that claim yet: write, and choose again (not counted as a
                -- look). A user not yet served comes first by exact counts, since the served
                -- ones' true places are only further back.
                IF v_pick.username = ANY (v_served) THEN
                    RETURN QUERY SELECT * FROM record_claims(v_pending, p_lease_ms);
                    v_pending := '{}';
                    v_served := '{}';
                    v_looks := v_looks - 1;
                    CONTINUE looks;
                END IF;
                CONTINUE looks WHEN v_pick.stale;

                -- The tenant's row, kept while other tenants compete for the component (V2),
                -- is written after the item, and waited for then only when its key sorts after
                -- every tenant row the transaction holds, the order in which everyone takes
                -- them, so that waits cannot form a cycle. Otherwise it is locked now without
                -- waiting; if another transaction (another broker's claims) holds it, the
                -- tenant is passed over for the rest of the batch, as a held user is.
                v_counted := tenant_has_rivals(v_service, v_component, v_pick.tenant);
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

                -- 4. Down the actor tree, unless all of the user's ready work is its own.
                v_path := '{}';
                v_own := v_pick;
                WHILE v_pick.ready_count > v_pick.local_ready LOOP
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

                -- 5 and 6: the node's best job step and its lowest free ready item, locked;
                -- written with the batch's other claims (record_claims).
                v_at := clock_timestamp();
                WITH step AS (
                    SELECT uw.job_id, uw.step_index, uw.ready_from,
                           uw.last_worked IS NULL AS first_claim
                      FROM user_work uw
                     WHERE uw.service = v_service
                       AND uw.component = v_component
                       AND uw.tenant = v_pick.tenant
                       AND uw.username = v_pick.username
                       AND uw.actor = v_path
                       AND uw.ready_count > 0
                       AND NOT uw.paused
                     ORDER BY uw.is_async, uw.last_worked NULLS FIRST, uw.job_id, uw.step_index
                     LIMIT 1
                )
                SELECT s.job_id, s.step_index, s.first_claim,
                       -- The ready items are read in index order, and only until the first
                       -- free one: from the step's ready_from, and from its start only if
                       -- nothing there was free (COALESCE runs the second probe only then).
                       coalesce((SELECT ready.id
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
                                    FOR NO KEY UPDATE SKIP LOCKED)) AS id
                  INTO v_item
                  FROM step s;
                -- No claimable step after all, or its last ready item went to another claim or
                -- a cancel in between: look again.
                CONTINUE looks WHEN v_item.id IS NULL;
                v_pending := v_pending || ROW(i, v_item.id, v_querier, v_worker, v_item.job_id,
                                              v_item.step_index, v_service, v_component,
                                              v_pick.tenant, v_pick.username, v_path, v_at,
                                              v_item.first_claim)::pending_claim;
                v_served := v_served || v_pick.username;
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
                v_claimed := v_claimed + 1;
                CONTINUE items;
            END LOOP;
            -- Four looks found the order moving under them: leave it to the broker's retry.
            EXIT items;
        END LOOP;
        IF v_claimed = 0 THEN
            RETURN NEXT;
        END IF;
    END LOOP;
    IF cardinality(v_pending) > 0 THEN
        RETURN QUERY SELECT * FROM record_claims(v_pending, p_lease_ms);
    END IF;
END;
$claims$;
