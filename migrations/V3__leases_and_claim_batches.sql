-- An item is running exactly when it holds a lease. Statements that address one item by id
-- say "running" as `lease_expires_at IS NOT NULL`: `status = 'running'` implies the predicates
-- of the partial indexes over running (and not-ready) items, so the planner may read the item
-- by a full scan of one of those instead of its primary key, priced from that index's row
-- estimate. Right after a bulk load those indexes are estimated empty while they grow with
-- every claim, and every completion then walked all of them until the next ANALYZE.
ALTER TABLE work_items
    ADD CONSTRAINT work_items_running_means_leased
        CHECK ((status = 'running') = (lease_expires_at IS NOT NULL));

-- Several workers' claims in one transaction: the broker gathers the claims that arrive while
-- its previous ones run, so that a commit, a round trip and a statement start are paid per
-- batch rather than per item. Request i asks for up to p_maxes[i] items of service
-- p_services[i] for worker slot p_workers[i] of querier p_queriers[i], leased for p_lease_ms.
-- Items are chosen one at a time, in request order, each by the fair order as the counters the
-- ones before it moved leave it. This replaces V2's claim_next_item, whose search it keeps
-- (described there), with what a batch lets it do once per request rather than per item:
-- the membership check and touch, and listing the components with work. Per item it also
-- skips the actor tree when none of the user's ready work is under an actor, and the job's
-- status when the step was worked before.
--
-- The result: a row per claimed item, tagged with its request's index (1-based); a request that
-- got nothing has one row with id NULL, and querier_state saying why (NULL: the querier is not
-- a member; 'shutting_down'; 'active': nothing claimable was free).
--
-- A chosen user whose place in the order changed since the statement's snapshot (`stale`, see
-- V2), or whose last item went elsewhere in between, is looked for again at once, up to four
-- times. A claim waits for its tenant's row only when that row sorts after every tenant row
-- the transaction holds (the order apply_tenant_deltas takes them in), so waits cannot form a
-- cycle.
DROP FUNCTION claim_next_item(text, text, integer, bigint, bigint, boolean);

CREATE FUNCTION claim_items(
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
BEGIN
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
                    SELECT uw.job_id, uw.step_index, uw.last_worked IS NULL AS first_claim
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
                     -- LATERAL, so that the ready items are read in index order, and only
                     -- until the first free one.
                     WHERE wi.id = (SELECT first_free.id
                                      FROM step s
                                     CROSS JOIN LATERAL (
                                           SELECT ready.id
                                             FROM work_items ready
                                            WHERE ready.job_id = s.job_id
                                              AND ready.step_index = s.step_index
                                              AND ready.component = v_component
                                              AND ready.status = 'ready'
                                            ORDER BY ready.id
                                            LIMIT 1
                                              FOR NO KEY UPDATE SKIP LOCKED
                                           ) first_free)
                 RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt,
                           wi.lease_expires_at, step.first_claim
                ), counted_step AS (
                    UPDATE user_work uw
                       SET ready_count = uw.ready_count - 1,
                           running_count = uw.running_count + 1,
                           last_worked = v_at
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
                -- The tenant's row, kept while other tenants compete for the component (V2).
                -- Waited for only when its key sorts after every tenant row the transaction
                -- holds, the order in which everyone takes them, so that waits cannot form a
                -- cycle; otherwise skipped if held, and left to the reaper's recount.
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
                    v_counted := FOUND;
                END IF;
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

-- V2's apply_step_deltas, with two statements fewer on the common path: the user's queue rows
-- take their new counts in one statement, and the job's open items are summed only when this
-- step has none left (otherwise the job has some). Same arguments and result; see V2.
CREATE OR REPLACE FUNCTION apply_step_deltas(
    p_job uuid,
    p_step integer,
    p_component text,
    p_ready integer,
    p_running integer,
    p_successful integer,
    p_failed integer,
    p_canceled integer,
    p_tenant_now boolean,
    OUT service text,
    OUT tenant text,
    OUT became_claimable boolean,
    OUT job_open_items integer
)
LANGUAGE plpgsql
AS $deltas$
#variable_conflict use_column
DECLARE
    v_step record;
    -- Paused steps' ready items are not claimable.
    v_claimable integer;
    v_running integer;
    v_queue_ready integer;
BEGIN
    UPDATE user_work uw
       SET ready_count = uw.ready_count + p_ready,
           running_count = uw.running_count + p_running,
           successful_count = uw.successful_count + p_successful,
           failed_count = uw.failed_count + p_failed,
           canceled_count = uw.canceled_count + p_canceled
     WHERE (uw.job_id, uw.step_index, uw.component) = (p_job, p_step, p_component)
 RETURNING uw.username, uw.service, uw.tenant, uw.actor, uw.paused,
           uw.ready_count + uw.running_count AS open_items
      INTO v_step;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    service := v_step.service;
    v_claimable := CASE WHEN v_step.paused THEN 0 ELSE p_ready END;

    IF p_running <> 0 THEN
        UPDATE users u
           SET running_count = u.running_count + p_running
         WHERE u.username = v_step.username
     RETURNING u.running_count INTO v_running;
    END IF;
    -- Every queue row of the user keeps its copy of the user's work in progress; this step's
    -- row also takes its counts.
    WITH changed AS (
        UPDATE service_users su
           SET running_count = coalesce(v_running, su.running_count),
               ready_count = su.ready_count + v_claimable,
               local_ready = su.local_ready
                   + CASE WHEN v_step.actor = '{}' THEN v_claimable ELSE 0 END,
               local_running = su.local_running
                   + CASE WHEN v_step.actor = '{}' THEN p_running ELSE 0 END
         WHERE su.username = v_step.username
           AND (su.service, su.component, su.tenant)
               = (v_step.service, p_component, v_step.tenant)
     RETURNING su.ready_count
    ), others AS (
        UPDATE service_users su
           SET running_count = v_running
         WHERE p_running <> 0
           AND su.username = v_step.username
           AND (su.service, su.component, su.tenant)
               <> (v_step.service, p_component, v_step.tenant)
    )
    SELECT changed.ready_count INTO v_queue_ready FROM changed;
    IF v_step.actor <> '{}' AND (v_claimable <> 0 OR p_running <> 0) THEN
        UPDATE actor_queues a
           SET ready_count = a.ready_count + v_claimable,
               running_count = a.running_count + p_running,
               local_ready = a.local_ready
                   + CASE WHEN a.path = v_step.actor THEN v_claimable ELSE 0 END,
               local_running = a.local_running
                   + CASE WHEN a.path = v_step.actor THEN p_running ELSE 0 END
         WHERE (a.username, a.service, a.component, a.tenant)
               = (v_step.username, v_step.service, p_component, v_step.tenant)
           AND (a.path = v_step.actor[1:1]
                OR a.path = v_step.actor[1:2]
                OR a.path = v_step.actor[1:3]);
    END IF;

    became_claimable := v_claimable > 0 AND v_queue_ready <= v_claimable;
    tenant := v_step.tenant;
    -- (The rivals check first: most completions are of a tenant alone in its component.)
    IF p_tenant_now
       AND (became_claimable
            OR (p_running <> 0 AND tenant_has_rivals(v_step.service, p_component, v_step.tenant)))
    THEN
        PERFORM apply_tenant_delta(v_step.service, p_component, v_step.tenant, p_running,
                                   became_claimable);
    END IF;

    job_open_items := v_step.open_items;
    IF job_open_items = 0 THEN
        SELECT coalesce(sum(uw.ready_count + uw.running_count), 0)::integer
          INTO job_open_items
          FROM user_work uw
         WHERE uw.job_id = p_job;
    END IF;
END;
$deltas$;

-- A batch of attempt endings in one statement: ending i records status p_statuses[i]
-- ('successful', 'failed', or 'ready' for a retry) for the current attempt p_attempts[i] of
-- running item p_ids[i], with results p_results[i], error p_errors[i] and p_next_components[i]
-- the component its results go on to (NULL: its own); with p_expired_only, only if the lease
-- has expired (the reaper's case). Each moves its step's counters (apply_step_deltas) and
-- wakes the service's waiting workers if the user's work became claimable.
--
-- The owner's users row is locked first (the lock order), in the same statement as the item's
-- update, so that the item's conditions are checked against its latest version after any wait
-- (a caller ending several attempts has locked all their owners, in order, beforehand).
--
-- Returns a row per ending that applied (none for a stale attempt, an item that is not
-- running, or no such item), with what the workflow needs next: whether the ending fans out
-- to the next step or may complete an aggregate's inputs; and whether nothing is left to do
-- for the tenant's row: it was brought up to date here (a lone ending that changes one step),
-- or its change is a no-op. Otherwise the caller applies the tenant deltas last, with those of
-- the workflow's growth.
CREATE FUNCTION finish_items(
    p_ids bigint[],
    p_attempts integer[],
    p_statuses text[],
    p_results jsonb[],
    p_errors text[],
    p_next_components text[],
    p_expired_only boolean
)
RETURNS TABLE (
    ending integer,
    job_id uuid,
    step_index integer,
    component text,
    results_component text,
    querier_leaving boolean,
    -- The workflow grows from this ending: its results become the next step's items, or it
    -- may complete the inputs of the job's aggregating step.
    fans_out boolean,
    may_aggregate boolean,
    service text,
    tenant text,
    became_claimable boolean,
    tenant_applied boolean,
    job_open_items integer
)
LANGUAGE plpgsql
AS $finish$
#variable_conflict use_column
DECLARE
    v_status text;
    v_next_step_aggregates boolean;
    v_job_aggregates boolean;
    v_change record;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        v_status := p_statuses[i];
        WITH owner AS (
            SELECT u.username
              FROM users u
             WHERE u.username = (
                       SELECT j.username
                         FROM work_items wi
                         JOIN jobs j ON j.job_id = wi.job_id
                        WHERE wi.id = p_ids[i]
                   )
               FOR NO KEY UPDATE
        )
        UPDATE work_items wi
           SET status = v_status::work_item_status,
               results = p_results[i],
               error = p_errors[i],
               next_component = p_next_components[i],
               lease_expires_at = NULL,
               updated_at = now()
         WHERE wi.id = p_ids[i]
           AND wi.attempt = p_attempts[i]
           -- Running, spelled so that only the primary key can find the item (see above).
           AND wi.lease_expires_at IS NOT NULL
           AND (NOT p_expired_only OR wi.lease_expires_at <= now())
           AND EXISTS (SELECT 1 FROM owner)
        RETURNING wi.job_id,
                  wi.step_index,
                  wi.component,
                  coalesce(wi.next_component, wi.component),
                  coalesce((SELECT q.state = 'shutting_down'
                              FROM queriers q
                             WHERE q.querier = wi.querier), false),
                  (SELECT next.aggregate
                     FROM job_steps next
                    WHERE next.job_id = wi.job_id
                      AND next.step_index = wi.step_index + 1),
                  EXISTS (SELECT 1
                            FROM job_steps agg
                           WHERE agg.job_id = wi.job_id
                             AND agg.aggregate)
             INTO job_id, step_index, component, results_component, querier_leaving,
                  v_next_step_aggregates, v_job_aggregates;
        CONTINUE WHEN NOT FOUND;

        fans_out := v_next_step_aggregates IS FALSE
                    AND jsonb_array_length(coalesce(p_results[i], '[]')) > 0;
        may_aggregate := v_job_aggregates AND v_status <> 'ready';
        -- Alone in its transaction and changing no other step: its tenant row is applied here.
        tenant_applied := cardinality(p_ids) = 1 AND NOT fans_out AND NOT may_aggregate;
        SELECT *
          INTO v_change
          FROM apply_step_deltas(job_id, step_index, component,
                                 (v_status = 'ready')::integer, -1,
                                 (v_status = 'successful')::integer,
                                 (v_status = 'failed')::integer, 0, tenant_applied) d;
        IF v_change.became_claimable THEN
            PERFORM pg_notify('fairway_work_ready', v_change.service);
        END IF;
        -- Nor is anything left for the caller when the tenant's row would not change: a tenant
        -- alone in its component keeps no running count (see tenant_queues in V2).
        tenant_applied := tenant_applied
            OR NOT (v_change.became_claimable
                    OR tenant_has_rivals(v_change.service, component, v_change.tenant));
        ending := i;
        service := v_change.service;
        tenant := v_change.tenant;
        became_claimable := v_change.became_claimable;
        job_open_items := v_change.job_open_items;
        RETURN NEXT;
    END LOOP;
END;
$finish$;
