-- claim_fair_round: several picks of the fair order in one statement, where taking the head of
-- the order as one set chooses exactly what picking one item at a time would. claim_items calls
-- it for a run of its requests that share a service and querier, when the service has one
-- component with claimable work and one tenant competing for it: then the order is the
-- tenant's users alone (claim_items step 3).
--
-- Why the head is exact: picking the first user, U1 with running count r, moves U1 to
-- (r + 1, now), behind every user of running count r + 1 or less, each worked before now. So
-- the first k users of the order, U1..Uk, are the next k picks one at a time would make, as
-- long as Uk's count is at most r + 1, no two are the same user, and each would claim one item
-- of its own. The head is cut at the first user that breaks this, or whose queue row lags the
-- user's counts, or who has work under actors (the order then goes down the actor tree): the
-- caller serves the rest one at a time. Each pick is stamped a microsecond after the one
-- before, so that they keep their order in last_worked.
--
-- Arguments: the service, querier and component; p_slots, one element per item the run still
-- wants, in the order they are served: the request it is for (an index into p_workers and
-- p_tokens, claim_items' arrays); the lease in milliseconds.
-- Answer: a row per user of the exact head, in pick order, each with the request its item went
-- to; id is NULL for a user whose step had no free item after all (another transaction held
-- it), which is where the caller stops taking sets.
-- Locks: as one pick of claim_items takes them, for every user of the head: the users row
-- (SKIP LOCKED), the item, then the counter rows. Only the one-tenant order is read, so no
-- tenant row is locked or written.

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
-- Planned once: a plan made afresh for each set would cost more than the set saves.
SET plan_cache_mode = force_generic_plan
AS $round$
#variable_conflict use_column
DECLARE
    v_at timestamptz := clock_timestamp();
    v_tenant text;
    v_least integer;
BEGIN
    -- The one active tenant queue, read as the one-at-a-time claim reads the tenants.
    SELECT tq.tenant
      INTO v_tenant
      FROM tenant_queues tq
      JOIN tenants t ON t.tenant = tq.tenant
     WHERE tq.service = p_service
       AND tq.component = p_component
       AND tq.active
       -- A scalar subquery, not EXISTS: it stays a primary-key probe.
       AND (NOT t.sharded
            OR (SELECT true
                  FROM tenant_shards ts
                 WHERE ts.tenant = tq.tenant
                   AND ts.querier = p_querier))
     ORDER BY tq.running_count, tq.last_worked NULLS FIRST, tq.tenant
     LIMIT 1;
    -- The least work in progress in the order: the head is exact only up to one more than
    -- that, and bounding the scan by it keeps it a short range of the order's index.
    SELECT su.running_count
      INTO v_least
      FROM service_users su
     WHERE (su.service, su.component, su.tenant) = (p_service, p_component, v_tenant)
       AND su.ready_count > 0
     ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
     LIMIT 1;
    IF v_least IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH head AS (
        SELECT su.username, su.running_count, su.last_worked,
               u.running_count IS NOT DISTINCT FROM su.running_count
                   AND u.last_worked IS NOT DISTINCT FROM su.last_worked
                   AND su.ready_count = su.local_ready AS exact_row
          FROM service_users su
          JOIN users u ON u.username = su.username
         WHERE su.service = p_service
           AND su.component = p_component
           AND su.tenant = v_tenant
           AND su.ready_count > 0
           -- From 0: a count that fell since v_least was read still sorts first.
           AND su.running_count BETWEEN 0 AND v_least + 1
         ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
         LIMIT cardinality(p_slots)
           FOR NO KEY UPDATE OF u SKIP LOCKED
    ), ranked AS (
        SELECT h.*, row_number() OVER in_order AS pick,
               first_value(h.running_count) OVER in_order AS first_count
          FROM head h
        WINDOW in_order AS (ORDER BY h.running_count, h.last_worked NULLS FIRST, h.username)
    ), picked AS (
        SELECT r.username, v_tenant AS tenant, r.pick, p_slots[r.pick] AS request,
               v_at + (r.pick - 1) * interval '1 microsecond' AS at
          FROM (SELECT r.*,
                       bool_and(r.exact_row AND r.running_count <= r.first_count + 1)
                           OVER (ORDER BY r.pick) AS exact
                  FROM ranked r) r
         WHERE r.exact
    ), step AS (
        SELECT p.*, s.job_id, s.step_index, s.first_claim,
               -- The step's lowest free ready item, from its ready_from, and from its start
               -- only if nothing there was free.
               (SELECT coalesce(
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
                               FOR NO KEY UPDATE SKIP LOCKED))) AS item_id
          FROM picked p
         CROSS JOIN LATERAL (
               SELECT uw.job_id, uw.step_index, uw.ready_from,
                      uw.last_worked IS NULL AS first_claim
                 FROM user_work uw
                WHERE uw.service = p_service
                  AND uw.component = p_component
                  AND uw.tenant = p.tenant
                  AND uw.username = p.username
                  AND uw.actor = '{}'
                  AND uw.ready_count > 0
                  AND NOT uw.paused
                ORDER BY uw.is_async, uw.last_worked NULLS FIRST, uw.job_id, uw.step_index
                LIMIT 1
               ) s
    ), item AS (
        UPDATE work_items wi
           SET status = 'running',
               attempt = wi.attempt + 1,
               lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
               querier = p_querier,
               worker = p_workers[st.request],
               claimed_by = p_tokens[st.request],
               updated_at = now()
          FROM step st
         WHERE wi.id = st.item_id
           -- The same rows, as a list the primary key is probed with.
           AND wi.id = ANY (ARRAY(SELECT chosen.item_id FROM step chosen))
     RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt,
               wi.lease_expires_at, st.username, st.tenant, st.pick, st.at, st.first_claim,
               (SELECT j.traceparent FROM jobs j WHERE j.job_id = wi.job_id) AS traceparent
    ), counted_steps AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count - 1,
               running_count = uw.running_count + 1,
               last_worked = item.at,
               ready_from = greatest(uw.ready_from, item.id)
          FROM item
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (item.job_id, item.step_index, p_component)
           AND uw.job_id = ANY (ARRAY(SELECT claimed.job_id FROM item claimed))
    ), user_counts AS (
        UPDATE users u
           SET running_count = u.running_count + 1,
               last_worked = item.at
          FROM item
         WHERE u.username = item.username
           AND u.username = ANY (ARRAY(SELECT claimed.username FROM item claimed))
     RETURNING u.username, item.tenant, u.running_count, u.last_worked
    ), queues AS (
        UPDATE service_users su
           SET running_count = uc.running_count,
               last_worked = uc.last_worked,
               ready_count = su.ready_count - 1,
               local_ready = su.local_ready - 1,
               local_running = su.local_running + 1,
               local_last_worked = uc.last_worked
          FROM user_counts uc
         WHERE (su.username, su.service, su.component, su.tenant)
               = (uc.username, p_service, p_component, uc.tenant)
           AND su.username = ANY (ARRAY(SELECT claimed.username FROM item claimed))
    ), started AS (
        -- Only a step never worked before can belong to a job not yet running.
        UPDATE jobs j
           SET status = 'running', updated_at = now()
         WHERE j.job_id = ANY (ARRAY(SELECT claimed.job_id FROM item claimed
                                      WHERE claimed.first_claim))
           AND j.status = 'accepted'
    )
    SELECT p.request, p.username, p.tenant, i.id, i.job_id, i.step_index, i.payload,
           i.inputs, i.attempt, i.lease_expires_at, i.traceparent
      FROM picked p
      LEFT JOIN item i ON i.pick = p.pick
     ORDER BY p.pick;
END;
$round$;
