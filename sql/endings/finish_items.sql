-- finish_items: ends a batch of attempts in one statement. Ending i records status
-- p_statuses[i] ('successful', 'failed', 'ready' for a retry at once, or 'scheduled' for a
-- retry p_delays_ms[i] milliseconds from now, which no claim sees until the promoter makes it
-- ready: promote_scheduled_items) for attempt p_attempts[i] of
-- running item p_ids[i], with results p_results[i], error p_errors[i], and p_next_components[i]
-- the component its results go on to (NULL: its own). The item keeps what the ending recorded
-- (ended_as) and p_digests[i], the digest of the worker's report (NULL when no worker sent it),
-- so that the broker recognises the same report sent again. An ending with p_uncounted[i]
-- (a claim whose worker never got its answer, released) records status 'ready' and takes the
-- claim's attempt back, leaving the previous ending's record and error as they were. An ending
-- with p_handed_back[i] (a worker that could not start the item hands it back) records status
-- 'ready' and keeps the attempt, so that a late report of it stays stale, but raises the
-- item's retry_base, so that the attempt does not count against the retry budget; it counts
-- the release and keeps p_errors[i] as the release's reason, the last failure's error as it
-- was. A successful ending keeps p_warnings[i], the worker's warning (NULL: none). With
-- p_expired_only an ending applies only if the lease has expired (the reaper's case). Each
-- counter row the batch touches moves once, by the batch's summed deltas; a service whose
-- user's work became claimable is woken.
--
-- With p_in_one_statement the call is its caller's whole transaction (autocommit), so it must
-- leave nothing for the caller to do: a batch in which any ending could grow its workflow (fan
-- out to the next step, or complete an aggregate's inputs) is refused before anything is
-- locked or written, with one row that says `needs_transaction`, and any other batch applies
-- its tenant rows' changes and finishes the jobs it emptied itself, last.
--
-- Answer: a row per ending that applied (`ending` says which; in no particular order), with
-- what the workflow needs next: whether the ending fans out to the next step or may complete
-- an aggregate's inputs, and whether the tenant's row is already up to date (changed here, or
-- a change that would change nothing); otherwise the caller applies the tenant deltas last.
-- A job whose items are all settled comes back with job_open_items 0; the caller finishes it
-- unless p_in_one_statement did.
-- An ending whose owner another transaction held comes back with `deferred` and nothing else:
-- its item still runs under that attempt, and the broker sends it again. A stale attempt, an
-- item that is not running, an attempt another token claimed (p_tokens), or no such item gives
-- no row.
--
-- Locks: the owners' users rows first, in username order. With p_wait_for_owners it waits for
-- each (the reaper, and an ending the broker has sent back many times, so that none is put off
-- for ever); without, it takes only the free ones (SKIP LOCKED), so that a batch never holds
-- some users' rows while it waits for others', which claims would then pass over. Then the
-- items and counter rows; the tenant rows are left to the caller, last. Runs from generic
-- plans: every statement is a primary-key probe per item or owner whatever the arguments,
-- and planning each call anew would cost more than running it.

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
    p_wait_for_owners boolean,
    -- Ending i's reporting token (tokens.id): it applies only to an attempt that token
    -- claimed (work_items.claimed_by). NULL (or no array): any attempt (an admin, the reaper,
    -- a broker without auth).
    p_tokens bigint[] DEFAULT NULL,
    -- Ending i's delay in milliseconds when it is scheduled (NULL, or no array: none).
    p_delays_ms bigint[] DEFAULT NULL,
    -- Whether ending i is a worker handing the item back (NULL, or no array: no).
    p_handed_back boolean[] DEFAULT NULL,
    -- Ending i's warning, kept on a successful item (NULL, or no array: none).
    p_warnings text[] DEFAULT NULL,
    p_in_one_statement boolean DEFAULT false
)
RETURNS TABLE (
    ending integer,
    job_id uuid,
    step_index integer,
    component text,
    results_component text,
    querier_leaving boolean,
    fans_out boolean,
    may_aggregate boolean,
    service text,
    tenant text,
    became_claimable boolean,
    tenant_applied boolean,
    job_open_items integer,
    deferred boolean,
    needs_transaction boolean
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $finish$
#variable_conflict use_column
DECLARE
    v_alone boolean := cardinality(p_ids) = 1;
    v_ended record;
    -- The owners of the batch's items, and those of them this transaction holds.
    v_wanted text[];
    v_owners text[];
    -- Whether a workflow may grow in a batch that is to be its own transaction.
    v_grows boolean;
    -- Whether another transaction held some owner, whose endings are then left alone.
    v_some_held boolean := false;
    -- What the batch settles itself: its tenant rows' changes and the jobs it emptied.
    v_settles boolean;
    v_tenant_services text[] := '{}';
    v_tenant_components text[] := '{}';
    v_tenant_names text[] := '{}';
    v_tenant_activate boolean[] := '{}';
    v_emptied uuid[] := '{}';
BEGIN
    -- The owners of the batch's items, and, for a batch that is its own transaction, whether
    -- any ending could grow its workflow, asked as the ending itself answers it below
    -- (fans_out, may_aggregate), from what never changes: the item's job and step.
    SELECT array_agg((SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id)),
           p_in_one_statement
           AND coalesce(bool_or(
                   (jsonb_array_length(coalesce(r.results, '[]')) > 0
                    AND EXISTS (SELECT 1
                                  FROM job_steps next_step
                                 WHERE next_step.job_id = wi.job_id
                                   AND next_step.step_index = wi.step_index + 1
                                   AND NOT next_step.aggregate))
                   OR (r.status NOT IN ('ready', 'scheduled')
                       AND EXISTS (SELECT 1
                                     FROM job_steps aggregate_step
                                    WHERE aggregate_step.job_id = wi.job_id
                                      AND aggregate_step.aggregate))),
                   false)
      INTO v_wanted, v_grows
      FROM unnest(p_ids, p_statuses, p_results) AS r(id, status, results)
      JOIN work_items wi ON wi.id = r.id;
    IF v_grows THEN
        RETURN QUERY SELECT 0, NULL::uuid, NULL::integer, NULL::text, NULL::text,
                            NULL::boolean, NULL::boolean, NULL::boolean, NULL::text, NULL::text,
                            NULL::boolean, NULL::boolean, NULL::integer, false, true;
        RETURN;
    END IF;
    v_settles := p_in_one_statement OR v_alone;

    -- The owners' users rows first (the lock order): all of them, waiting, or only those
    -- free now. The statements below take fresh snapshots, so they read each item as the last
    -- transaction that held its owner left it.
    IF p_wait_for_owners THEN
        SELECT coalesce(array_agg(held.username), '{}')
          INTO v_owners
          FROM (SELECT DISTINCT w.username
                  FROM unnest(v_wanted) AS w(username)
                 ORDER BY w.username) w
         CROSS JOIN LATERAL (SELECT u.username
                               FROM users u
                              WHERE u.username = w.username
                                FOR NO KEY UPDATE) held;
    ELSE
        SELECT coalesce(array_agg(held.username) FILTER (WHERE held.username IS NOT NULL),
                        '{}'),
               count(*) > count(held.username)
          INTO v_owners, v_some_held
          FROM (SELECT DISTINCT w.username
                  FROM unnest(v_wanted) AS w(username)
                 ORDER BY w.username) w
          LEFT JOIN LATERAL (SELECT u.username
                               FROM users u
                              WHERE u.username = w.username
                                FOR NO KEY UPDATE SKIP LOCKED) held ON true;
    END IF;

    -- Every item, then every counter row, each updated once with the sum of its deltas: a
    -- step's (user_work), its owner's (users, and the copies in the owner's service_users rows
    -- that would lead it), its queue's (service_users) and its actor path's (actor_queues).
    FOR v_ended IN
        WITH requested AS (
            SELECT r.*
              FROM unnest(p_ids, p_attempts, p_statuses, p_results, p_errors, p_next_components,
                          p_digests, p_uncounted, p_delays_ms)
                   WITH ORDINALITY
                   AS r(id, attempt, status, results, error, next_component, digest, uncounted,
                        delay_ms, i)
        ), ended AS (
            UPDATE work_items wi
               SET status = r.status::work_item_status,
                   results = r.results,
                   error = CASE WHEN r.uncounted OR p_handed_back[r.i::integer]
                                THEN wi.error ELSE r.error END,
                   retry_base = wi.retry_base
                                + CASE WHEN p_handed_back[r.i::integer] THEN 1 ELSE 0 END,
                   releases = wi.releases
                              + CASE WHEN p_handed_back[r.i::integer] THEN 1 ELSE 0 END,
                   release_reason = CASE WHEN p_handed_back[r.i::integer]
                                         THEN r.error ELSE wi.release_reason END,
                   warning = p_warnings[r.i::integer],
                   next_component = r.next_component,
                   attempt = wi.attempt - CASE WHEN r.uncounted THEN 1 ELSE 0 END,
                   ended_as = CASE WHEN r.uncounted THEN wi.ended_as
                                   ELSE r.status::work_item_status END,
                   ending_digest = CASE WHEN r.uncounted THEN wi.ending_digest ELSE r.digest END,
                   lease_expires_at = NULL,
                   not_before = CASE WHEN r.status = 'scheduled'
                                     THEN now() + r.delay_ms * interval '1 millisecond' END,
                   updated_at = now()
              FROM requested r
             WHERE wi.id = r.id
               AND wi.attempt = r.attempt
               -- Running, spelled so that only the primary key can find the item (see
               -- work_items_running_means_leased).
               AND wi.lease_expires_at IS NOT NULL
               AND (NOT p_expired_only OR wi.lease_expires_at <= now())
               AND (p_tokens[r.i::integer] IS NULL OR wi.claimed_by = p_tokens[r.i::integer])
               AND (SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id) = ANY(v_owners)
            RETURNING r.i,
                      r.status,
                      wi.job_id,
                      wi.step_index,
                      wi.component,
                      coalesce(wi.next_component, wi.component) AS results_component,
                      coalesce((SELECT q.state = 'shutting_down'
                                  FROM queriers q
                                 WHERE q.querier = wi.querier), false) AS querier_leaving,
                      (SELECT next.aggregate
                         FROM job_steps next
                        WHERE next.job_id = wi.job_id
                          AND next.step_index = wi.step_index + 1) IS FALSE
                          AND jsonb_array_length(coalesce(r.results, '[]')) > 0 AS fans_out,
                      EXISTS (SELECT 1
                                FROM job_steps agg
                               WHERE agg.job_id = wi.job_id
                                 AND agg.aggregate)
                          AND r.status NOT IN ('ready', 'scheduled') AS may_aggregate
        ), step_deltas AS (
            SELECT e.job_id, e.step_index, e.component,
                   count(*) FILTER (WHERE e.status = 'ready') AS ready,
                   count(*) FILTER (WHERE e.status = 'scheduled') AS scheduled,
                   count(*) AS ended,
                   count(*) FILTER (WHERE e.status = 'successful') AS successful,
                   count(*) FILTER (WHERE e.status = 'failed') AS failed
              FROM ended e
             GROUP BY e.job_id, e.step_index, e.component
        ), steps AS (
            UPDATE user_work uw
               SET ready_count = uw.ready_count + d.ready,
                   scheduled_count = uw.scheduled_count + d.scheduled,
                   running_count = uw.running_count - d.ended,
                   successful_count = uw.successful_count + d.successful,
                   failed_count = uw.failed_count + d.failed
              FROM step_deltas d
             WHERE (uw.job_id, uw.step_index, uw.component)
                   = (d.job_id, d.step_index, d.component)
            RETURNING uw.job_id, uw.step_index, uw.component, uw.username, uw.service,
                      uw.tenant, uw.actor, uw.paused, d.ended,
                      -- Paused steps' ready items are not claimable.
                      CASE WHEN uw.paused THEN 0 ELSE d.ready END AS claimable,
                      uw.ready_count + uw.scheduled_count + uw.running_count AS open_items
        ), owners AS (
            UPDATE users u
               SET running_count = u.running_count - o.ended
              FROM (SELECT s.username, sum(s.ended) AS ended
                      FROM steps s
                     GROUP BY s.username) o
             WHERE u.username = o.username
            RETURNING u.username, u.running_count, u.last_worked
        ), queue_deltas AS (
            SELECT s.username, s.service, s.component, s.tenant,
                   sum(s.claimable) AS claimable,
                   sum(s.claimable) FILTER (WHERE s.actor = '{}') AS local_claimable,
                   sum(s.ended) FILTER (WHERE s.actor = '{}') AS local_ended
              FROM steps s
             GROUP BY s.username, s.service, s.component, s.tenant
        ), queues AS (
            -- A copy of the owner's counts may lag them, never lead them (see claim_items):
            -- the ended items' queue rows take their counts and the owner's, and any other row
            -- of the owner only where its copy would otherwise lead. Rows that lag are left
            -- for the claim that finds one at the head of its order, so that a user with work
            -- in many services costs an ending no more rows than one with work in one.
            UPDATE service_users su
               SET running_count = o.running_count,
                   last_worked = o.last_worked,
                   (ready_count, local_ready, local_running) = (
                       SELECT su.ready_count + coalesce(sum(q.claimable), 0),
                              su.local_ready + coalesce(sum(q.local_claimable), 0),
                              su.local_running - coalesce(sum(q.local_ended), 0)
                         FROM queue_deltas q
                        WHERE (q.username, q.service, q.component, q.tenant)
                              = (su.username, su.service, su.component, su.tenant))
              FROM owners o
             WHERE su.username = o.username
               AND (su.running_count > o.running_count
                    OR EXISTS (SELECT 1
                                 FROM queue_deltas q
                                WHERE (q.username, q.service, q.component, q.tenant)
                                      = (su.username, su.service, su.component, su.tenant)))
            RETURNING su.username, su.service, su.component, su.tenant, su.ready_count
        ), actor_deltas AS (
            -- Each step's path and its prefixes: the nodes above its jobs count them too.
            SELECT s.username, s.service, s.component, s.tenant, s.actor[1:depth] AS path,
                   sum(s.claimable) AS claimable,
                   sum(s.ended) AS ended,
                   sum(s.claimable) FILTER (WHERE depth = cardinality(s.actor))
                       AS local_claimable,
                   sum(s.ended) FILTER (WHERE depth = cardinality(s.actor)) AS local_ended
              FROM steps s
             -- (Paths are at most three deep; constant bounds let the planner count the rows.)
             CROSS JOIN generate_series(1, 3) AS depth
             WHERE depth <= cardinality(s.actor)
             GROUP BY s.username, s.service, s.component, s.tenant, s.actor[1:depth]
        ), actors AS (
            UPDATE actor_queues a
               SET ready_count = a.ready_count + d.claimable,
                   running_count = a.running_count - d.ended,
                   local_ready = a.local_ready + coalesce(d.local_claimable, 0),
                   local_running = a.local_running - coalesce(d.local_ended, 0)
              FROM actor_deltas d
             WHERE (a.username, a.service, a.component, a.tenant, a.path)
                   = (d.username, d.service, d.component, d.tenant, d.path)
        ), woken AS (
            -- A queue whose ready items were none before this batch's retries became
            -- claimable: it wakes the service's workers once, with its first retry here.
            SELECT min(e.i) AS i
              FROM ended e
              JOIN steps s
                ON (s.job_id, s.step_index, s.component) = (e.job_id, e.step_index, e.component)
              JOIN queue_deltas d
                ON (d.username, d.service, d.component, d.tenant)
                   = (s.username, s.service, s.component, s.tenant)
              JOIN queues q
                ON (q.username, q.service, q.component, q.tenant)
                   = (s.username, s.service, s.component, s.tenant)
             WHERE d.claimable > 0
               AND q.ready_count <= d.claimable
               AND e.status = 'ready'
               AND NOT s.paused
             GROUP BY s.username, s.service, s.component, s.tenant
        ), contested AS MATERIALIZED (
            -- Whether other tenants compete for each tenant queue the batch ended items of:
            -- asked once a queue, not once an ending (materialized, or the planner would fold
            -- the question into the join below and ask it for every row).
            SELECT q.service, q.component, q.tenant,
                   tenant_has_rivals(q.service, q.component, q.tenant) AS rivals
              FROM (SELECT DISTINCT s.service, s.component, s.tenant FROM steps s) q
        )
        SELECT e.i, e.job_id, e.step_index, e.component, e.results_component, e.querier_leaving,
               e.fans_out, e.may_aggregate, s.service, s.tenant, s.open_items, c.rivals,
               EXISTS (SELECT 1 FROM woken w WHERE w.i = e.i) AS became_claimable
          FROM ended e
          JOIN steps s
            ON (s.job_id, s.step_index, s.component) = (e.job_id, e.step_index, e.component)
          JOIN contested c
            ON (c.service, c.component, c.tenant) = (s.service, s.component, s.tenant)
    LOOP
        ending := v_ended.i;
        job_id := v_ended.job_id;
        step_index := v_ended.step_index;
        component := v_ended.component;
        results_component := v_ended.results_component;
        querier_leaving := v_ended.querier_leaving;
        fans_out := v_ended.fans_out;
        may_aggregate := v_ended.may_aggregate;
        service := v_ended.service;
        tenant := v_ended.tenant;
        became_claimable := v_ended.became_claimable;
        IF became_claimable THEN
            PERFORM pg_notify('fairway_work_ready', service);
        END IF;
        -- The tenant's row: in a batch that settles itself and changing no other step, the
        -- ending's change is applied here, last; otherwise the caller applies it, last,
        -- unless it would not change (a tenant alone in its component keeps no running count).
        tenant_applied := v_settles AND NOT fans_out AND NOT may_aggregate;
        IF tenant_applied AND (became_claimable OR v_ended.rivals) THEN
            v_tenant_services := v_tenant_services || service;
            v_tenant_components := v_tenant_components || component;
            v_tenant_names := v_tenant_names || tenant;
            v_tenant_activate := v_tenant_activate || became_claimable;
        END IF;
        tenant_applied := tenant_applied OR NOT (became_claimable OR v_ended.rivals);
        -- The job has items open while this step has; otherwise its other steps say.
        job_open_items := v_ended.open_items;
        IF job_open_items = 0 THEN
            SELECT coalesce(sum(uw.ready_count + uw.scheduled_count + uw.running_count),
                            0)::integer
              INTO job_open_items
              FROM user_work uw
             WHERE uw.job_id = v_ended.job_id;
            IF job_open_items = 0 AND p_in_one_statement THEN
                v_emptied := v_emptied || v_ended.job_id;
            END IF;
        END IF;
        deferred := false;
        needs_transaction := false;
        RETURN NEXT;
    END LOOP;
    IF cardinality(v_emptied) > 0 THEN
        PERFORM finish_jobs(ARRAY(SELECT DISTINCT e.job_id
                                    FROM unnest(v_emptied) AS e(job_id)
                                   ORDER BY e.job_id));
    END IF;
    IF cardinality(v_tenant_services) > 0 THEN
        PERFORM apply_tenant_deltas(v_tenant_services, v_tenant_components, v_tenant_names,
                                    array_fill(-1, ARRAY[cardinality(v_tenant_services)]),
                                    v_tenant_activate);
    END IF;

    -- The endings left alone because another transaction held their owner: their items still
    -- run under the attempts named. (None when every owner was free.)
    IF v_some_held THEN
        RETURN QUERY
            SELECT r.i::integer, NULL::uuid, NULL::integer, NULL::text, NULL::text,
                   NULL::boolean, NULL::boolean, NULL::boolean, NULL::text, NULL::text,
                   NULL::boolean, NULL::boolean, NULL::integer, true, false
              FROM unnest(p_ids, p_attempts) WITH ORDINALITY AS r(id, attempt, i)
              JOIN work_items wi ON wi.id = r.id
             WHERE wi.attempt = r.attempt
               AND wi.lease_expires_at IS NOT NULL
               AND (p_tokens[r.i::integer] IS NULL OR wi.claimed_by = p_tokens[r.i::integer])
               AND (SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id) <> ALL (v_owners);
    END IF;
END;
$finish$;
