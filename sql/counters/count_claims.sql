-- count_claims: moves the counters for items a claim has leased, in the claim's transaction.
-- Moves: the steps' user_work rows (ready down, running up, last worked, ready_from past the
-- last item leased); the users rows (running up, last worked, a rate-limited user's bucket
-- billed: once empty, the user leaves the fair order until its next item is due); the claimed
-- queue's service_users rows (the user's counts copied, ready and, for a user's own jobs, the
-- local counts moved); with an actor path, the path's actor_queues rows; a policed tenant's
-- bucket; and the tenant_queues row when it counts claims (tenants compete).
-- Only the claimed queue's row is written: the user's rows in other queues keep their copies,
-- which then sort no later than the user does, and are brought level when one of them comes
-- to the head of its order (claim_fair_user). The claimed rows take their turns (turn_start):
-- the users' and the counted tenant row's passes move on, and their orders' clocks with them.
--
-- Arguments: the service, component and tenant claimed from; entry i, one per user, says user
-- p_usernames[i] took p_items[i] items of step (p_job_ids[i], p_step_indexes[i]), the last at
-- p_last_at[i] with id p_last_ids[i], and whether that step is the user's only claimable one
-- of the queue (p_only_steps[i]: then the step's order column stays, keeping its update HOT;
-- track_claimable_step levels it if another step joins). p_path: the actor path claimed under
-- ('{}': the user's own jobs; a path is claimed for one user at a time). p_tenant_policed:
-- the tenant has a cap or rate limit; p_counted: its tenant_queues row counts claims.
-- p_passes: each user's pass after its picks, where a set worked them out (take_turns); NULL
-- for a single pick, whose turn is taken here. p_user_clock and p_tenant_clock: the clocks of
-- the queue's users' order and of the component's tenants' order, as the batch carries them.
-- Answer: users, the number of users counted; the two clocks after the claims.
-- Locks, in the claim's order: user_work, users (the claim holds them already),
-- service_users, actor_queues, tenants, tenant_queues.

CREATE OR REPLACE FUNCTION count_claims(
    p_service text,
    p_component text,
    p_tenant text,
    p_usernames text[],
    p_job_ids uuid[],
    p_step_indexes integer[],
    p_items integer[],
    p_last_at timestamptz[],
    p_last_ids bigint[],
    p_only_steps boolean[],
    p_path text[],
    p_tenant_policed boolean,
    p_counted boolean,
    p_passes bigint[],
    p_user_clock bigint,
    p_tenant_clock bigint,
    OUT users integer,
    OUT user_clock bigint,
    OUT tenant_clock bigint
)
LANGUAGE plpgsql
-- One plan for any number of entries: a plan made for each call's arrays would be remade on
-- every claim, and costs more than the updates it plans.
SET plan_cache_mode = force_generic_plan
AS $count$
DECLARE
    v_start bigint;
BEGIN
    user_clock := p_user_clock;
    tenant_clock := p_tenant_clock;
    WITH claimed AS (
        SELECT c.*
          FROM unnest(p_usernames, p_job_ids, p_step_indexes, p_items, p_last_at, p_last_ids,
                      p_only_steps, p_passes)
               AS c(username, job_id, step_index, items, last_at, last_id, only_step, pass)
    ), steps AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count - c.items,
               running_count = uw.running_count + c.items,
               last_worked = c.last_at,
               order_worked = CASE WHEN c.only_step THEN uw.order_worked ELSE c.last_at END,
               ready_from = greatest(uw.ready_from, c.last_id)
          FROM claimed c
         WHERE (uw.job_id, uw.step_index, uw.component) = (c.job_id, c.step_index, p_component)
           -- The same rows, as a list the primary key is probed with.
           AND uw.job_id = ANY (p_job_ids)
    ), owners AS (
        UPDATE users u
           SET running_count = u.running_count + c.items,
               last_worked = c.last_at,
               next_free = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_charged(u.rate_per_second, u.next_free, c.items) END,
               throttled_until = CASE WHEN u.rate_per_second > 0 THEN
                   bucket_due(u.rate_per_second, u.burst,
                              bucket_charged(u.rate_per_second, u.next_free, c.items))
               END
          FROM claimed c
         WHERE u.username = c.username
           AND u.username = ANY (p_usernames)
     RETURNING u.username, c.items, u.running_count, u.last_worked,
               u.throttled_until IS NOT NULL AS throttled, c.only_step, c.job_id, c.step_index,
               c.pass
    ), queues AS (
        UPDATE service_users su
           SET running_count = o.running_count,
               last_worked = o.last_worked,
               throttled = o.throttled,
               ready_count = su.ready_count - o.items,
               local_ready = su.local_ready - CASE WHEN p_path = '{}' THEN o.items ELSE 0 END,
               local_running = su.local_running + CASE WHEN p_path = '{}' THEN o.items ELSE 0 END,
               local_last_worked = CASE WHEN p_path = '{}' THEN o.last_worked
                                        ELSE su.local_last_worked END,
               lone_job_id = CASE WHEN o.only_step THEN o.job_id ELSE su.lone_job_id END,
               lone_step_index = CASE WHEN o.only_step THEN o.step_index
                                      ELSE su.lone_step_index END,
               pass = coalesce(o.pass, turn_start(su.pass, su.fresh, su.weight, p_user_clock)
                                       + stride_for_weight(su.weight)),
               fresh = false
          FROM owners o
         WHERE (su.username, su.service, su.component, su.tenant)
               = (o.username, p_service, p_component, p_tenant)
           AND su.username = ANY (p_usernames)
         RETURNING su.pass - stride_for_weight(su.weight) AS start
    )
    SELECT count(*), max(q.start) INTO users, v_start FROM queues q;
    IF p_passes IS NULL THEN
        user_clock := greatest(p_user_clock, v_start);
    END IF;
    IF p_path <> '{}' THEN
        UPDATE actor_queues a
           SET ready_count = a.ready_count - p_items[1],
               running_count = a.running_count + p_items[1],
               last_worked = p_last_at[1],
               local_ready = a.local_ready - CASE WHEN a.path = p_path THEN p_items[1] ELSE 0 END,
               local_running = a.local_running
                               + CASE WHEN a.path = p_path THEN p_items[1] ELSE 0 END,
               local_last_worked = CASE WHEN a.path = p_path THEN p_last_at[1]
                                        ELSE a.local_last_worked END
         WHERE (a.username, a.service, a.component, a.tenant)
               = (p_usernames[1], p_service, p_component, p_tenant)
           AND (a.path = p_path[1:1] OR a.path = p_path[1:2] OR a.path = p_path[1:3]);
    END IF;
    IF p_tenant_policed THEN
        UPDATE tenants t
           SET next_free = bucket_charged(t.rate_per_second, t.next_free,
                                          (SELECT sum(i)::integer FROM unnest(p_items) i))
         WHERE t.tenant = p_tenant
           AND t.rate_per_second > 0;
    END IF;
    IF p_counted THEN
        UPDATE tenant_queues tq
           SET running_count = tq.running_count + (SELECT sum(i)::integer FROM unnest(p_items) i),
               last_worked = (SELECT max(at) FROM unnest(p_last_at) at),
               pass = turn_start(tq.pass, tq.fresh, tq.weight, p_tenant_clock)
                      + stride_for_weight(tq.weight),
               fresh = false
         WHERE (tq.service, tq.component, tq.tenant) = (p_service, p_component, p_tenant)
     RETURNING tq.pass - stride_for_weight(tq.weight) INTO v_start;
        tenant_clock := greatest(p_tenant_clock, v_start);
    END IF;
END;
$count$;
