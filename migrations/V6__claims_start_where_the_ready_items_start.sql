-- Where a job step's ready items start, so that a claim does not walk over the ones claimed
-- before it.
--
-- A claim took the step's lowest ready item by reading work_items_ready from the start of the
-- step's range. Every item claimed leaves its entry there, dead, until VACUUM visits
-- work_items, and autovacuum does so only after a fifth of the table has changed. A big job's
-- claims therefore walked further with every item the job had handed out: after 1,826 claims
-- of one job (10 users × 1,000,000 items), finding its next item read 18 buffers and took
-- 0.22 ms, as long as the rest of the claim.
--
-- user_work.ready_from is a lower bound of the step's ready ids: a claim starts reading there
-- and moves it up to the item it took. An item that becomes ready again (a retry, an expired
-- lease) moves it back down (trigger below). New items have greater ids than any claimed
-- before them, with one exception: items of one step inserted by two transactions at once,
-- where the one that commits second may hold the lower ids. Such an item, or one whose claim
-- rolled back after a later item's claim moved the bound past it, is found once nothing at or
-- above the bound is free: a claim that finds nothing there reads the step from its start.
-- Late, then, never lost.
ALTER TABLE user_work ADD COLUMN ready_from bigint NOT NULL DEFAULT 0;

CREATE FUNCTION lower_ready_from()
RETURNS trigger
LANGUAGE plpgsql
AS $lower$
BEGIN
    UPDATE user_work uw
       SET ready_from = NEW.id
     WHERE (uw.job_id, uw.step_index, uw.component) = (NEW.job_id, NEW.step_index, NEW.component)
       AND uw.ready_from > NEW.id;
    RETURN NULL;
END;
$lower$;

CREATE TRIGGER work_items_ready_again
    AFTER UPDATE OF status ON work_items
    FOR EACH ROW
    WHEN (NEW.status = 'ready' AND OLD.status <> 'ready')
    EXECUTE FUNCTION lower_ready_from();

-- V5's claim_items, reading each step's ready items from its ready_from.
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
    -- Tenant queues whose rows other transactions held when this one could not wait for them.
    v_passed text[] := '{}';
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
        v_claimed := 0;
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
            <<looks>>
            FOR look IN 1 .. 4 LOOP
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

                -- 5 and 6, in one statement: the node's best job step, its lowest ready item,
                -- leased, and the counters moved with it (nothing moves if no item was free).
                -- One instant for every row this claim touches, as in V2.
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
                ), item AS (
                    UPDATE work_items wi
                       SET status = 'running',
                           attempt = wi.attempt + 1,
                           lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
                           querier = v_querier,
                           worker = v_worker,
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
                           wi.lease_expires_at, step.first_claim
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
                    UPDATE users u
                       SET running_count = u.running_count + 1,
                           last_worked = v_at
                     WHERE u.username = v_pick.username
                       AND EXISTS (SELECT 1 FROM item)
                 RETURNING u.running_count
                ), queues AS (
                    -- Every row of the user takes the new copies; the claimed queue's row also
                    -- its counts, and its own-jobs counts when the job has no actor path.
                    UPDATE service_users su
                       SET running_count = uc.running_count,
                           last_worked = v_at,
                           ready_count = su.ready_count
                               - CASE WHEN (su.service, su.component, su.tenant)
                                           = (v_service, v_component, v_pick.tenant)
                                      THEN 1 ELSE 0 END,
                           local_ready = su.local_ready
                               - CASE WHEN (su.service, su.component, su.tenant)
                                           = (v_service, v_component, v_pick.tenant)
                                       AND v_path = '{}'
                                      THEN 1 ELSE 0 END,
                           local_running = su.local_running
                               + CASE WHEN (su.service, su.component, su.tenant)
                                           = (v_service, v_component, v_pick.tenant)
                                       AND v_path = '{}'
                                      THEN 1 ELSE 0 END,
                           local_last_worked = CASE WHEN (su.service, su.component, su.tenant)
                                                         = (v_service, v_component, v_pick.tenant)
                                                     AND v_path = '{}'
                                                    THEN v_at ELSE su.local_last_worked END
                      FROM user_counts uc
                     WHERE su.username = v_pick.username
                )
                SELECT item.id, item.job_id, item.step_index, item.payload, item.inputs,
                       item.attempt, item.lease_expires_at, item.first_claim
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
                RETURN NEXT;
                CONTINUE items;
            END LOOP;
            -- Four looks found the order moving under them: leave it to the broker's retry.
            EXIT items;
        END LOOP;
        IF v_claimed = 0 THEN
            username := NULL;
            id := NULL;
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$claims$;
