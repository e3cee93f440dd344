-- claim_step_item: the fair order's last two levels, and the claim itself, for a user
-- claim_items has chosen and locked:
-- 5. The node's best job step: synchronous first, then the job's higher priority, then least
--    recently worked. A strategy names its step instead.
-- 6. The step's lowest ready item of the component, read from the step's ready_from, leased;
--    and in the same transaction the step's user_work row, the users row (a rate-limited
--    user's bucket billed with it), the claimed queue's service_users row and the path's
--    actor_queues rows move, a policed tenant's bucket is billed, the tenant's row takes the
--    claim while other tenants compete for the component, and a job's first claim marks it
--    running.
--
-- Arguments: the service and component; the querier, worker slot and token claiming, and the
-- lease in milliseconds; the user, its tenant and the actor path chosen; the step a strategy
-- chose (NULL: the node's best); whether the tenant has a cap or a rate limit, and whether
-- its tenant_queues row counts claims (tenants compete).
-- Answer: the item (id NULL when no step had a free ready item after all: nothing moved).
-- Locks: the item (SKIP LOCKED), then the counter rows: user_work, users (held already),
-- service_users, actor_queues, tenants, tenant_queues (locked or waited for by the caller in
-- its order), jobs.

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
BEGIN
    -- 5 and 6, in one statement: nothing moves if no item was free.
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
    ), counted_step AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count - 1,
               running_count = uw.running_count + 1,
               last_worked = v_at,
               order_worked = CASE WHEN lone.only_step THEN uw.order_worked ELSE v_at END,
               ready_from = greatest(uw.ready_from, item.id)
          FROM item, lone
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (item.job_id, item.step_index, p_component)
    ), user_counts AS (
        -- A rate-limited user's bucket is billed; once empty, the user leaves the fair order
        -- until its next item is due (throttled_until).
        UPDATE users u
           SET running_count = u.running_count + 1,
               last_worked = v_at,
               next_free = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_charged(u.rate_per_second, u.next_free, 1) END,
               throttled_until = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_due(u.rate_per_second, u.burst,
                              bucket_charged(u.rate_per_second, u.next_free, 1))
               END
         WHERE u.username = p_username
           AND EXISTS (SELECT 1 FROM item)
     RETURNING u.running_count, u.throttled_until IS NOT NULL AS throttled
    ), queues AS (
        -- Only the claimed queue's row: the user's rows in other queues keep their copies,
        -- which now sort no later than the user does, and are brought level when one of them
        -- comes to the head of its order (claim_fair_user).
        UPDATE service_users su
           SET running_count = uc.running_count,
               last_worked = v_at,
               throttled = uc.throttled,
               ready_count = su.ready_count - 1,
               local_ready = su.local_ready - CASE WHEN p_path = '{}' THEN 1 ELSE 0 END,
               local_running = su.local_running + CASE WHEN p_path = '{}' THEN 1 ELSE 0 END,
               local_last_worked = CASE WHEN p_path = '{}' THEN v_at
                                        ELSE su.local_last_worked END,
               lone_job_id = CASE WHEN lone.only_step THEN item.job_id ELSE su.lone_job_id END,
               lone_step_index = CASE WHEN lone.only_step THEN item.step_index
                                      ELSE su.lone_step_index END
          FROM user_counts uc, item, lone
         WHERE (su.username, su.service, su.component, su.tenant)
               = (p_username, p_service, p_component, p_tenant)
    )
    SELECT item.id, item.job_id, item.step_index, item.payload, item.inputs, item.attempt,
           item.lease_expires_at, item.traceparent, item.first_claim
      INTO id, job_id, step_index, payload, inputs, attempt, lease_expires_at, traceparent,
           v_first_claim
      FROM item;
    IF id IS NULL THEN
        RETURN;
    END IF;
    IF p_path <> '{}' THEN
        UPDATE actor_queues a
           SET ready_count = a.ready_count - 1,
               running_count = a.running_count + 1,
               last_worked = v_at,
               local_ready = a.local_ready - CASE WHEN a.path = p_path THEN 1 ELSE 0 END,
               local_running = a.local_running + CASE WHEN a.path = p_path THEN 1 ELSE 0 END,
               local_last_worked = CASE WHEN a.path = p_path THEN v_at
                                        ELSE a.local_last_worked END
         WHERE (a.username, a.service, a.component, a.tenant)
               = (p_username, p_service, p_component, p_tenant)
           AND (a.path = p_path[1:1] OR a.path = p_path[1:2] OR a.path = p_path[1:3]);
    END IF;
    IF p_tenant_policed THEN
        UPDATE tenants t
           SET next_free = bucket_charged(t.rate_per_second, t.next_free, 1)
         WHERE t.tenant = p_tenant
           AND t.rate_per_second > 0;
    END IF;
    IF p_counted THEN
        UPDATE tenant_queues tq
           SET running_count = tq.running_count + 1,
               last_worked = v_at
         WHERE (tq.service, tq.component, tq.tenant) = (p_service, p_component, p_tenant);
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
