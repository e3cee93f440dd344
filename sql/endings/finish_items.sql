-- finish_items: ends a batch of attempts, with everything that follows from them, in one
-- statement: a status update takes this one path, whatever it changes. Ending i records status
-- p_statuses[i] ('successful', 'failed', 'ready' for a retry at once, or 'scheduled' for a
-- retry p_delays_ms[i] milliseconds from now, which no claim sees until the promoter makes it
-- ready) for attempt p_attempts[i] of running item p_ids[i], with results p_results[i], error
-- p_errors[i], and p_next_components[i] the component its results go on to (NULL: its own).
-- The item keeps what the ending recorded (ended_as) and p_digests[i], the digest of the
-- worker's report (NULL when no worker sent it), so that the broker recognises the same
-- report sent again. An ending with p_uncounted[i] (a claim whose worker never got its
-- answer, released) records 'ready' and takes the claim's attempt back, leaving the previous
-- ending's record and error as they were. An ending with p_handed_back[i] (a worker that
-- could not start the item) records 'ready' and keeps the attempt, so that a late report of
-- it stays stale, but raises the item's retry_base, so that the attempt does not count
-- against the retry budget; it counts the release and keeps p_errors[i] as its reason. A
-- successful ending keeps p_warnings[i]. With p_expired_only an ending applies only if the
-- lease has expired (the reaper's case).
--
-- In order: the owners are locked (lock_ending_owners); the endings recorded on their items
-- (record_endings); every counter row moved once by the batch's summed deltas
-- (count_endings); each workflow grown (grow_workflow); the jobs left with nothing open
-- finished (finish_jobs); and the tenant rows' changes applied, last (apply_tenant_deltas).
-- A service whose user's work became claimable is woken.
--
-- Answer: a row per ending that applied (`ending` says which; in no particular order): its
-- job, service and tenant, whether its querier is shutting down, whether its user's work
-- became claimable, and how many items of its job are open (0 may be finished: finish_jobs). An ending whose owner
-- another transaction held comes back `deferred` and nothing else: its item still runs under
-- that attempt, and the broker sends it again. A stale attempt, an item that is not running,
-- an attempt another token claimed (p_tokens), or no such item gives no row.
-- Locks: the owners' users rows first, then the items, the counter rows, the new steps' rows,
-- the jobs, and the tenant rows last, in key order.

CREATE OR REPLACE FUNCTION finish_items(
    p_ids bigint[],
    p_attempts integer[],
    p_statuses text[],
    p_results jsonb[],
    p_errors text[],
    p_next_components text[],
    p_digests bytea[],
    p_uncounted boolean[],
    p_expired_only boolean,
    -- Whether to wait for owners other transactions hold (lock_ending_owners).
    p_wait_for_owners boolean,
    -- Ending i's reporting token (tokens.id); NULL (or no array): any attempt.
    p_tokens bigint[] DEFAULT NULL,
    p_delays_ms bigint[] DEFAULT NULL,
    p_handed_back boolean[] DEFAULT NULL,
    p_warnings text[] DEFAULT NULL
)
RETURNS TABLE (
    ending integer,
    job_id uuid,
    service text,
    tenant text,
    querier_leaving boolean,
    became_claimable boolean,
    job_open_items integer,
    deferred boolean
)
LANGUAGE plpgsql
-- Every statement is a primary-key probe per item or owner whatever the arguments, and
-- planning each call anew would cost more than running it.
SET plan_cache_mode = force_generic_plan
AS $finish$
#variable_conflict use_column
DECLARE
    v_owners record;
    v_ended record;
    v_grown record;
    -- The tenant rows' changes, applied last, and the jobs the batch may have emptied.
    v_tenant_services text[] := '{}';
    v_tenant_components text[] := '{}';
    v_tenant_names text[] := '{}';
    v_tenant_running integer[] := '{}';
    v_tenant_activate boolean[] := '{}';
    v_emptied uuid[] := '{}';
    v_open_items integer;
BEGIN
    v_owners := lock_ending_owners(p_ids, p_wait_for_owners);
    FOR v_ended IN
        WITH ended AS MATERIALIZED (
            SELECT *
              FROM record_endings(p_ids, p_attempts, p_statuses, p_results, p_errors,
                                  p_next_components, p_digests, p_uncounted, p_expired_only,
                                  p_tokens, p_delays_ms, p_handed_back, p_warnings,
                                  v_owners.owners)
        ), counted AS (
            SELECT c.*
              FROM (SELECT array_agg(e.job_id) AS job_ids, array_agg(e.step_index) AS steps,
                           array_agg(e.component) AS components, array_agg(e.status) AS statuses
                      FROM ended e) a
             CROSS JOIN LATERAL count_endings(a.job_ids, a.steps, a.components, a.statuses) c
        ), woken AS (
            -- A queue whose ready items were none before this batch's retries became
            -- claimable: it wakes the service's workers once, with its first retry here.
            SELECT min(e.i) AS i
              FROM ended e
              JOIN counted s
                ON (s.job_id, s.step_index, s.component) = (e.job_id, e.step_index, e.component)
             WHERE s.queue_woke
               AND e.status = 'ready'
               AND NOT s.paused
             GROUP BY s.username, s.service, s.component, s.tenant
        ), contested AS MATERIALIZED (
            -- Whether other tenants compete for each tenant queue the batch ended items of:
            -- asked once a queue, not once an ending (materialized, or the planner would fold
            -- the question into the join below and ask it for every row).
            SELECT q.service, q.component, q.tenant,
                   tenant_has_rivals(q.service, q.component, q.tenant) AS rivals
              FROM (SELECT DISTINCT s.service, s.component, s.tenant FROM counted s) q
        )
        SELECT e.i, e.job_id, e.step_index, e.component, e.results_component, e.querier_leaving,
               e.fans_out, e.may_aggregate, s.service, s.tenant, s.open_items, c.rivals,
               EXISTS (SELECT 1 FROM woken w WHERE w.i = e.i) AS became_claimable
          FROM ended e
          JOIN counted s
            ON (s.job_id, s.step_index, s.component) = (e.job_id, e.step_index, e.component)
          JOIN contested c
            ON (c.service, c.component, c.tenant) = (s.service, s.component, s.tenant)
    LOOP
        IF v_ended.became_claimable THEN
            PERFORM pg_notify('fairway_work_ready', v_ended.service);
        END IF;
        -- A tenant alone in its component keeps no running count, so its row changes only
        -- when its queue became claimable.
        IF v_ended.became_claimable OR v_ended.rivals THEN
            v_tenant_services := v_tenant_services || v_ended.service;
            v_tenant_components := v_tenant_components || v_ended.component;
            v_tenant_names := v_tenant_names || v_ended.tenant;
            v_tenant_running := v_tenant_running || -1;
            v_tenant_activate := v_tenant_activate || v_ended.became_claimable;
        END IF;
        -- The job has items open while this step has; otherwise its other steps say.
        v_open_items := v_ended.open_items;
        IF v_ended.fans_out OR v_ended.may_aggregate THEN
            v_grown := grow_workflow(p_ids[v_ended.i::integer], v_ended.job_id, v_ended.step_index,
                                     v_ended.results_component, v_ended.fans_out,
                                     v_ended.may_aggregate);
            v_open_items := coalesce(v_grown.job_open_items, v_open_items);
            v_tenant_services := v_tenant_services || v_grown.services;
            v_tenant_components := v_tenant_components || v_grown.components;
            v_tenant_names := v_tenant_names || v_grown.tenants;
            v_tenant_running := v_tenant_running
                                || array_fill(0, ARRAY[cardinality(v_grown.services)]);
            v_tenant_activate := v_tenant_activate
                                 || array_fill(true, ARRAY[cardinality(v_grown.services)]);
        END IF;
        -- finish_jobs checks each job again, so one a later ending of the batch grew stays.
        IF v_open_items = 0 THEN
            v_emptied := v_emptied || v_ended.job_id;
        END IF;
        ending := v_ended.i;
        job_id := v_ended.job_id;
        service := v_ended.service;
        tenant := v_ended.tenant;
        querier_leaving := v_ended.querier_leaving;
        became_claimable := v_ended.became_claimable;
        job_open_items := v_open_items;
        deferred := false;
        RETURN NEXT;
    END LOOP;
    IF cardinality(v_emptied) > 0 THEN
        PERFORM finish_jobs(ARRAY(SELECT DISTINCT e.job_id
                                    FROM unnest(v_emptied) AS e(job_id)
                                   ORDER BY e.job_id));
    END IF;
    IF cardinality(v_tenant_services) > 0 THEN
        PERFORM apply_tenant_deltas(v_tenant_services, v_tenant_components, v_tenant_names,
                                    v_tenant_running, v_tenant_activate);
    END IF;

    -- The endings left alone because another transaction held their owner: their items still
    -- run under the attempts named. (None when every owner was free.)
    IF v_owners.some_held THEN
        RETURN QUERY
            SELECT r.i::integer, NULL::uuid, NULL::text, NULL::text, NULL::boolean,
                   NULL::boolean, NULL::integer, true
              FROM unnest(p_ids, p_attempts) WITH ORDINALITY AS r(id, attempt, i)
              JOIN work_items wi ON wi.id = r.id
             WHERE wi.attempt = r.attempt
               AND wi.lease_expires_at IS NOT NULL
               AND (p_tokens[r.i::integer] IS NULL OR wi.claimed_by = p_tokens[r.i::integer])
               AND (SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id)
                   <> ALL (v_owners.owners);
    END IF;
END;
$finish$;
