-- claim_strategy_step: the step a request with a claim strategy (README "Claim strategies")
-- takes its next item from, in place of the fair order's levels 1 to 5. Its attempts are tried
-- in turn, each reading the claimable steps in the attempt's order (open_strategy_steps). Each
-- step met is checked against the attempt's other filters, the querier's shards and its caps
-- by the logged running counts; the first that passes and whose user is free is chosen, and
-- claim_step_item takes its lowest ready item as it takes the fair order's. An attempt that is
-- the fair order itself, unfiltered and uncapped, hands the request back to the fair order.
--
-- A value found capped is passed over for the rest of the transaction: its own claims only add
-- to the count, and capacity that others free is seen by the next transaction. The job found
-- capped is passed over with no statement at all, since every claim of the batch meets it
-- again at the head of the order. Under a hard cap (max_simultaneous) the value's
-- strategy_running row is locked (SKIP LOCKED) and its count read afresh first, so that no two
-- transactions admit against the same count (check_hard_caps). A step whose user is at its cap or out of tokens
-- is passed over, as is one of a tenant passed over. At most 256 steps are read per attempt,
-- so that steps held or capped at the head of an order cannot make a claim walk the backlog.
--
-- Arguments: the service, querier, the request's attempts as the broker normalises them
-- ([{"order", "only": [{"key", "value"}], "caps": [{"key", "max", "hard"}]}]), and the tenant
-- queues passed over, as ROW(service, component, tenant)::text; in and out, the capped values
-- met, as ROW(service, key, value, max)::text, and the jobs met capped, as ROW(service,
-- job_id, the attempt's caps)::text.
-- Answer: chosen and the step with its user, tenant, actor path and whether the tenant has a
-- cap or a rate limit; else use_fair when an attempt is the fair order. passed_over says a step
-- was passed over because another transaction held its user or capped value's row (so that
-- looking again may find it); limited ('cap', 'rate') and retry_ms why a user held it back.
-- Locks: the chosen step's users row (FOR NO KEY UPDATE SKIP LOCKED), then check_hard_caps'.

CREATE OR REPLACE FUNCTION claim_strategy_step(
    p_service text,
    p_querier text,
    p_attempts jsonb,
    p_passed text[],
    INOUT capped_values text[],
    INOUT capped_jobs text[],
    OUT chosen boolean,
    OUT use_fair boolean,
    OUT job_id uuid,
    OUT step_index integer,
    OUT component text,
    OUT username text,
    OUT tenant text,
    OUT actor text[],
    OUT tenant_policed boolean,
    OUT passed_over boolean,
    OUT limited text,
    OUT retry_ms bigint
)
LANGUAGE plpgsql
AS $strategy$
DECLARE
    v_attempt jsonb;
    v_cursor refcursor;
    v_candidate record;
    v_pick record;
    v_user record;
    v_hard record;
    v_capped_job text;
    v_newly_capped text[];
    v_capped_count bigint;
BEGIN
    chosen := false;
    use_fair := false;
    passed_over := false;
    <<attempts>>
    FOR attempt_no IN 0 .. jsonb_array_length(p_attempts) - 1 LOOP
        v_attempt := p_attempts -> attempt_no;
        IF v_attempt ->> 'order' = 'fair' AND v_attempt -> 'only' = '[]'
           AND v_attempt -> 'caps' = '[]'
        THEN
            use_fair := true;
            RETURN;
        END IF;
        v_cursor := open_strategy_steps(p_service, v_attempt ->> 'order',
                                        v_attempt -> 'only' -> 0);
        <<candidates>>
        FOR seen IN 1 .. 256 LOOP
            FETCH v_cursor INTO v_candidate;
            EXIT candidates WHEN NOT FOUND;
            -- Every cap, by the running counts as logged so far (exact for hard caps only once
            -- locked, below). A job found capped costs no statement when met again.
            IF v_attempt -> 'caps' <> '[]' THEN
                v_capped_job := ROW(p_service, v_candidate.job_id,
                                    v_attempt -> 'caps')::text;
                CONTINUE candidates WHEN v_capped_job = ANY (capped_jobs);
                SELECT array_agg(c.capped) FILTER (WHERE c.capped <> ALL (capped_values)),
                       count(*)
                  INTO v_newly_capped, v_capped_count
                  FROM (SELECT m.key, m.value, r.running,
                               (cap ->> 'max')::integer AS max,
                               ROW(p_service, m.key, m.value, cap ->> 'max')::text
                                   AS capped
                          FROM jsonb_array_elements(v_attempt -> 'caps') cap
                          JOIN job_metadata m
                            ON (m.job_id, m.key)
                               = (v_candidate.job_id, cap ->> 'key')
                          JOIN strategy_running r
                            ON (r.service, r.key, r.value)
                               = (p_service, m.key, m.value)) c
                 WHERE c.capped = ANY (capped_values)
                    OR c.running
                       + coalesce((SELECT sum(l.running)
                                     FROM strategy_running_changes l
                                    WHERE (l.service, l.key, l.value)
                                          = (p_service, c.key, c.value)),
                                  0)
                       >= c.max;
                IF v_capped_count > 0 THEN
                    capped_values := capped_values || coalesce(v_newly_capped, '{}');
                    capped_jobs := capped_jobs || v_capped_job;
                    CONTINUE candidates;
                END IF;
            END IF;
            -- The step's other filters, the querier's shards, a tenant passed over.
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
               AND uw.claimable
               AND ROW(p_service, uw.component, uw.tenant)::text
                   <> ALL (p_passed)
               AND (NOT t.sharded
                    OR (SELECT true
                          FROM tenant_shards ts
                         WHERE ts.tenant = uw.tenant
                           AND ts.querier = p_querier))
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
            -- A user at its cap, or out of tokens until the batch that finds its next item due, is
            -- passed over as the fair order leaves it out.
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
            IF v_attempt -> 'caps' <> '[]' THEN
                v_hard := check_hard_caps(p_service, v_candidate.job_id, v_attempt -> 'caps');
                IF v_hard.held THEN
                    passed_over := true;
                    CONTINUE candidates;
                END IF;
                IF v_hard.capped IS NOT NULL THEN
                    capped_values := capped_values || v_hard.capped;
                    capped_jobs := capped_jobs || v_capped_job;
                    CONTINUE candidates;
                END IF;
            END IF;
            chosen := true;
            EXIT candidates;
        END LOOP;
        CLOSE v_cursor;
        IF chosen THEN
            job_id := v_candidate.job_id;
            step_index := v_candidate.step_index;
            component := v_candidate.component;
            username := v_pick.username;
            tenant := v_pick.tenant;
            actor := v_pick.actor;
            tenant_policed := v_pick.tenant_policed;
            RETURN;
        END IF;
    END LOOP;
END;
$strategy$;
