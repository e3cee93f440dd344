-- claim_step_item: the fair order's last two levels, and the claim itself, for a user
-- claim_items has chosen and locked:
-- 5. The node's best job step: synchronous first, then the job's higher priority, then least
--    recently worked. A strategy names its step instead.
-- 6. The step's lowest ready item of the component, read from the step's ready_from, leased;
--    then the counters move (count_claims), and a job's first claim marks it running.
--
-- Arguments: the service and component; the querier, worker slot and token claiming, and the
-- lease in milliseconds; the user, its tenant and the actor path chosen; the step a strategy
-- chose (NULL: the node's best); whether the tenant has a cap or a rate limit, and whether
-- its tenant_queues row counts claims (tenants compete); the batch's clocks (fair_clock).
-- Answer: the batch's clocks after the claim's turns, and the item (id NULL when no step had a
-- free ready item after all: nothing moved).
-- Locks: the item (SKIP LOCKED), then count_claims' counter rows (the tenant_queues row
-- locked or waited for by the caller in its order), then jobs.

CREATE OR REPLACE FUNCTION claim_step_item(
    p_service text,
    p_component text,
    p_querier text,
    p_worker integer,
    p_token bigint,
    p_lease_ms bigint,
    p_username text,
    p_tenant text,
    p_path text[],
    p_step_job uuid,
    p_step_index integer,
    p_tenant_policed boolean,
    p_counted boolean,
    INOUT clocks jsonb,
    OUT id bigint,
    OUT job_id uuid,
    OUT step_index integer,
    OUT payload jsonb,
    OUT inputs jsonb,
    OUT attempt integer,
    OUT lease_expires_at timestamptz,
    OUT traceparent text
)
LANGUAGE plpgsql
AS $item$
DECLARE
    -- One instant for every row this claim touches.
    v_at timestamptz := clock_timestamp();
    v_first_claim boolean;
    v_only_step boolean;
    v_counts record;
BEGIN
    -- 5 and 6, in one statement: nothing is leased or counted if no item was free.
    WITH step AS (
        (SELECT uw.job_id, uw.step_index, uw.ready_from,
                uw.last_worked IS NULL AS first_claim
           FROM user_work uw
          WHERE p_step_job IS NULL
            AND uw.service = p_service
            AND uw.component = p_component
            AND uw.tenant = p_tenant
            AND uw.username = p_username
            AND uw.actor = p_path
            AND uw.claimable
          ORDER BY {{step_order uw}}
          LIMIT 1)
        UNION ALL
        SELECT uw.job_id, uw.step_index, uw.ready_from, uw.last_worked IS NULL AS first_claim
          FROM user_work uw
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (p_step_job, p_step_index, p_component)
           AND uw.claimable
    ), lone AS (
        -- Whether the step is the user's only claimable one of the queue (never under an
        -- actor): then its order column stays as it is and the step row's update is HOT
        -- (track_claimable_step). Not asked for a step a strategy named: a strategy's claims
        -- leave dead entries at the head of the user's steps in the index, which the probe
        -- would walk on every claim, and such users mostly hold many steps anyway.
        SELECT count(*) = 1 AS only_step
          FROM (SELECT 1
                  FROM user_work other
                 WHERE other.service = p_service
                   AND other.component = p_component
                   AND other.tenant = p_tenant
                   AND other.username = p_username
                   AND other.actor = '{}'
                   AND p_path = '{}'
                   AND p_step_job IS NULL
                   AND other.claimable
                 LIMIT 2) two
    ), item AS (
        UPDATE work_items wi
           SET status = 'running',
               attempt = wi.attempt + 1,
               lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
               querier = p_querier,
               worker = p_worker,
               claimed_by = p_token,
               updated_at = now()
          FROM step
         -- The ready items are read in index order, and only until the first free one: from
         -- the step's ready_from, and from its start only if nothing there was free
         -- (COALESCE runs the second probe only then).
         WHERE wi.id = (SELECT coalesce(
                                   (SELECT ready.id
                                      FROM work_items ready
                                     WHERE ready.job_id = s.job_id
                                       AND ready.step_index = s.step_index
                                       AND ready.component = p_component
                                       AND ready.status = 'ready'
                                       AND ready.id >= s.ready_from
                                     ORDER BY ready.id
                                     LIMIT 1
                                       FOR NO KEY UPDATE SKIP LOCKED),
                                   (SELECT ready.id
                                      FROM work_items ready
                                     WHERE ready.job_id = s.job_id
                                       AND ready.step_index = s.step_index
                                       AND ready.component = p_component
                                       AND ready.status = 'ready'
                                     ORDER BY ready.id
                                     LIMIT 1
                                       FOR NO KEY UPDATE SKIP LOCKED))
                          FROM step s)
     RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt,
               wi.lease_expires_at, step.first_claim,
               (SELECT j.traceparent FROM jobs j WHERE j.job_id = wi.job_id) AS traceparent
    )
    SELECT item.id, item.job_id, item.step_index, item.payload, item.inputs, item.attempt,
           item.lease_expires_at, item.traceparent, item.first_claim, lone.only_step
      INTO id, job_id, step_index, payload, inputs, attempt, lease_expires_at, traceparent,
           v_first_claim, v_only_step
      FROM item, lone;
    IF id IS NULL THEN
        RETURN;
    END IF;
    -- The user's turn, and the tenant's where its row counts claims (count_claims).
    v_counts := count_claims(p_service, p_component, p_tenant, ARRAY[p_username],
                             ARRAY[job_id], ARRAY[step_index], ARRAY[1], ARRAY[v_at],
                             ARRAY[id], ARRAY[v_only_step], p_path, p_tenant_policed,
                             p_counted, NULL, fair_clock(clocks, p_service, p_component, p_tenant),
                             CASE WHEN p_counted THEN
                                 fair_clock(clocks, p_service, p_component, NULL)
                             END);
    clocks := carry_fair_clock(clocks, p_service, p_component, p_tenant, v_counts.user_clock);
    IF p_counted THEN
        clocks := carry_fair_clock(clocks, p_service, p_component, NULL, v_counts.tenant_clock);
    END IF;
    -- Only a step never worked before can belong to a job not yet running.
    IF v_first_claim THEN
        UPDATE jobs j
           SET status = 'running', updated_at = now()
         WHERE j.job_id = claim_step_item.job_id
           AND j.status = 'accepted';
    END IF;
END;
$item$;
