-- claim_items: the claim. Serves a batch of workers' requests in one transaction: request i
-- asks for up to p_maxes[i] items of service p_services[i] for worker slot p_workers[i] of
-- querier p_queriers[i], leased for p_lease_ms to token p_tokens[i], which alone may then
-- report on them. Items are chosen one at a time, in request order, each by the fair order as
-- the items before it left the counters (docs/design.md), a function per level: the batch's
-- start (begin_claim_batch); 1. the components (list_components); 2 and 3. tenant, then user
-- (claim_fair_user, claim_tenant_row); 4. the actor tree (claim_actor_path); 5 and 6. the step
-- and its item (claim_step_item). Where the next choices are known to be the head of the
-- order they are made as sets (claim_fair_round); a request with a strategy takes its step from
-- claim_strategy_step. The levels are called as plain expressions, which start no executor.
--
-- Answer: a row per claimed item, tagged with its request's index (1-based). A request that got
-- nothing has one row with id NULL and querier_state saying why: NULL, the querier is not a
-- member yet (the broker has it join, then asks again); 'shutting_down'; 'active', nothing
-- claimable was free. passed_over: a strategy passed a step over that another transaction held.
-- Locks: each level's, in the order they are called, which every transaction keeps.

CREATE OR REPLACE FUNCTION claim_items(
    p_services text[],
    p_queriers text[],
    p_workers integer[],
    p_maxes integer[],
    p_lease_ms bigint,
    -- An active querier's last_seen moves at most once per this many milliseconds.
    p_touch_ms bigint,
    -- Request i's strategy (NULL: the fair order), as claim_strategy_step takes it.
    p_strategies jsonb[],
    -- Request i's token (tokens.id); NULL (or no array): claimed without a token.
    p_tokens bigint[] DEFAULT NULL
)
RETURNS TABLE (
    request integer, querier_state text, username text, id bigint, job_id uuid,
    step_index integer, component text, payload jsonb, inputs jsonb, attempt integer,
    lease_expires_at timestamptz, tenant text, actor text[], passed_over boolean,
    traceparent text,
    -- Why a policy held the request back, 'cap' or 'rate', and when an item is due.
    limited text, retry_ms bigint
)
LANGUAGE plpgsql
AS $claims$
#variable_conflict use_column
DECLARE
    i integer; v_service text; v_querier text;
    -- The batch's start (begin_claim_batch): the requests' order, maxes and policies, and
    -- in held the greatest (service, component, tenant) key of the tenant rows it holds.
    v_batch record;
    -- The (service, querier) whose components were last listed (list_components), the list.
    v_checked text[]; v_listed record; v_count integer; v_claimed integer;
    -- Tenant queues passed over for the batch, as ROW(service, component, tenant)::text.
    v_passed text[] := '{}';
    -- The capped values and jobs this transaction's strategies met (claim_strategy_step).
    v_capped text[] := '{}'; v_capped_jobs text[] := '{}';
    -- The choice for one item, from a strategy or from the fair order's levels.
    v_strategy record; v_pick record; v_chosen boolean; v_tenant_policed boolean;
    v_step_job uuid; v_step_index integer; v_tenant_row record; v_item record;
    -- How many items each request got (so far, from sets), and whether to take another set.
    v_served integer[] := array_fill(0, ARRAY[cardinality(p_services)]);
    v_set record; v_more boolean;
    -- The clocks of the weighted orders the batch took turns in, written at its end.
    v_clocks jsonb := '{}';
BEGIN
    v_batch := begin_claim_batch(p_services, p_queriers, p_maxes);
    FOREACH i IN ARRAY v_batch.in_order LOOP
        v_service := p_services[i]; v_querier := p_queriers[i];
        IF ARRAY[v_service, v_querier] IS DISTINCT FROM v_checked THEN
            v_checked := ARRAY[v_service, v_querier];
            v_listed := list_components(v_service, v_querier, p_touch_ms);
            v_count := CASE WHEN v_listed.querier_state = 'active'
                            THEN coalesce(cardinality(v_listed.components), 0) ELSE 0 END;
            querier_state := v_listed.querier_state; passed_over := false;
            -- Where one tenant is all the order holds, fair requests take sets of the order's
            -- head for as long as that is exact (claim_fair_round), then single items below.
            v_more := v_count = 1 AND NOT v_listed.contested[1];
            WHILE v_more LOOP
                v_more := false;
                FOR v_set IN
                    SELECT *
                      FROM claim_fair_round(v_service, v_querier, v_listed.components[1],
                                            p_services, p_queriers, p_strategies, v_batch.maxes,
                                            v_served, p_workers, p_tokens, p_lease_ms,
                                            v_clocks)
                LOOP
                    v_more := v_set.more;
                    v_clocks := v_set.clocks;
                    CONTINUE WHEN v_set.id IS NULL;
                    v_served[v_set.request] := v_served[v_set.request] + 1;
                    request := v_set.request;
                    username := v_set.username;
                    id := v_set.id;
                    job_id := v_set.job_id;
                    step_index := v_set.step_index;
                    component := v_listed.components[1];
                    payload := v_set.payload;
                    inputs := v_set.inputs;
                    attempt := v_set.attempt;
                    lease_expires_at := v_set.lease_expires_at;
                    tenant := v_set.tenant;
                    actor := '{}';
                    traceparent := v_set.traceparent;
                    limited := v_batch.limited[v_set.request];
                    retry_ms := v_batch.retry_ms[v_set.request];
                    RETURN NEXT;
                END LOOP;
            END LOOP;
        END IF;
        request := i; passed_over := false;
        v_claimed := v_served[i];
        limited := v_batch.limited[i]; retry_ms := v_batch.retry_ms[i];
        <<items>>
        WHILE v_claimed < v_batch.maxes[i] AND v_count > 0 LOOP
            <<looks>>
            FOR look IN 1 .. 16 LOOP
                v_chosen := false;
                v_step_job := NULL; v_step_index := NULL;
                actor := '{}';
                IF p_strategies[i] IS NOT NULL THEN
                    v_strategy := claim_strategy_step(v_service, v_querier, p_strategies[i],
                                                      v_passed, v_capped, v_capped_jobs);
                    v_capped := v_strategy.capped_values;
                    v_capped_jobs := v_strategy.capped_jobs;
                    passed_over := passed_over OR v_strategy.passed_over;
                    limited := coalesce(v_strategy.limited, limited);
                    retry_ms := least(retry_ms, v_strategy.retry_ms);
                    EXIT items WHEN NOT (v_strategy.chosen OR v_strategy.use_fair);
                    v_chosen := v_strategy.chosen;
                END IF;
                IF v_chosen THEN
                    username := v_strategy.username; tenant := v_strategy.tenant;
                    component := v_strategy.component;
                    v_tenant_policed := v_strategy.tenant_policed;
                    actor := v_strategy.actor;
                    v_step_job := v_strategy.job_id;
                    v_step_index := v_strategy.step_index;
                ELSE
                    v_pick := claim_fair_user(v_service, v_querier, v_listed.components,
                                              p_workers[i], v_passed);
                    -- Nothing free for this request: the rest of the batch may still find work.
                    EXIT items WHEN v_pick.username IS NULL;
                    CONTINUE looks WHEN v_pick.stale;
                    username := v_pick.username; tenant := v_pick.tenant;
                    component := v_pick.component;
                    v_tenant_policed := v_pick.tenant_policed;
                    IF v_pick.ready_count > v_pick.local_ready THEN
                        actor := claim_actor_path(username, v_service, component, tenant,
                                                  v_pick.local_ready, v_pick.local_running,
                                                  v_pick.local_last_worked);
                    END IF;
                END IF;
                v_tenant_row := claim_tenant_row(v_service, component, tenant, v_tenant_policed,
                                                 v_listed.components, v_listed.contested,
                                                 v_batch.held);
                IF v_tenant_row.passed THEN
                    v_passed := v_passed || ROW(v_service, component, tenant)::text;
                    limited := coalesce(v_tenant_row.limited, limited);
                    retry_ms := least(retry_ms, v_tenant_row.retry_ms);
                    CONTINUE looks;
                END IF;
                v_item := claim_step_item(v_service, component, v_querier, p_workers[i],
                                          p_tokens[i], p_lease_ms, username, tenant, actor,
                                          v_step_job, v_step_index, v_tenant_policed,
                                          v_tenant_row.counted, v_clocks);
                -- Its last ready item went to another claim or a cancel in between: look again.
                CONTINUE looks WHEN v_item.id IS NULL;
                v_clocks := v_item.clocks;
                IF v_tenant_row.counted THEN
                    v_batch.held := greatest(v_batch.held, ARRAY[v_service, component, tenant]);
                END IF;
                v_claimed := v_claimed + 1;
                id := v_item.id;
                job_id := v_item.job_id;
                step_index := v_item.step_index;
                payload := v_item.payload;
                inputs := v_item.inputs;
                attempt := v_item.attempt;
                lease_expires_at := v_item.lease_expires_at;
                traceparent := v_item.traceparent;
                RETURN NEXT;
                CONTINUE items;
            END LOOP;
            -- Sixteen looks found the order moving under them: leave it to the broker's retry.
            EXIT items;
        END LOOP;
        v_served[i] := v_claimed;
        -- A request that got nothing answers one row, whose querier_state says why.
        IF v_claimed = 0 THEN
            SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
              INTO username, id, job_id, step_index, component, payload, inputs, attempt,
                   lease_expires_at, tenant, actor, traceparent;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF v_batch.policed THEN
        PERFORM charge_services(p_services, v_served);
    END IF;
    IF v_clocks <> '{}' THEN
        PERFORM save_fair_clocks(v_clocks);
    END IF;
END;
$claims$;
