-- apply_step_deltas: moves the item counts of one job step and component by the given
-- deltas, and keeps the user's users, service_users and actor_queues rows in step, in the
-- transaction that moved the items, so that the counters never drift. The caller has created
-- the rows (create_step_queues.sql).
--
-- Arguments: the job, step and component; the ready, running, successful, failed, canceled
-- and scheduled deltas (scheduled items are open work, but no fair-order row counts them);
-- p_tenant_now applies the tenant change here rather than leaving it to the
-- caller's apply_tenant_deltas at the end of its transaction.
-- Answer: the step's service (NULL: no such step) and tenant; whether the user's claimable
-- work there went from none to some (only then can a worker be waiting, so only then is a
-- notification worth its commit-time lock, and must the tenant's queue be active); and how
-- many items of the job are still ready, scheduled or running.
-- Locks: the caller holds the user's users row; this takes the step's user_work row, the
-- user's service_users and actor_queues rows, and with p_tenant_now the tenant row last.

CREATE OR REPLACE FUNCTION apply_step_deltas(
    p_job uuid,
    p_step integer,
    p_component text,
    p_ready integer,
    p_running integer,
    p_successful integer,
    p_failed integer,
    p_canceled integer,
    p_scheduled integer,
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
    v_last_worked timestamptz;
    v_queue_ready integer;
BEGIN
    UPDATE user_work uw
       SET ready_count = uw.ready_count + p_ready,
           running_count = uw.running_count + p_running,
           successful_count = uw.successful_count + p_successful,
           failed_count = uw.failed_count + p_failed,
           canceled_count = uw.canceled_count + p_canceled,
           scheduled_count = uw.scheduled_count + p_scheduled
     WHERE (uw.job_id, uw.step_index, uw.component) = (p_job, p_step, p_component)
 RETURNING uw.username, uw.service, uw.tenant, uw.actor, uw.paused,
           uw.ready_count + uw.scheduled_count + uw.running_count AS open_items
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
     RETURNING u.running_count, u.last_worked INTO v_running, v_last_worked;
    END IF;
    -- A copy of the user's counts may lag the users row (a claim moves only its own queue's),
    -- never lead it: this step's row takes the user's counts and its own, and the user's other
    -- rows are lowered only where they would otherwise lead (as finish_items does).
    WITH changed AS (
        UPDATE service_users su
           SET running_count = coalesce(v_running, su.running_count),
               last_worked = CASE WHEN p_running <> 0 THEN v_last_worked
                                  ELSE su.last_worked END,
               ready_count = su.ready_count + v_claimable,
               fresh = su.fresh OR su.ready_count = 0,
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
           SET running_count = v_running,
               last_worked = v_last_worked
         WHERE su.username = v_step.username
           AND su.running_count > v_running
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
        SELECT coalesce(sum(uw.ready_count + uw.scheduled_count + uw.running_count), 0)::integer
          INTO job_open_items
          FROM user_work uw
         WHERE uw.job_id = p_job;
    END IF;
END;
$deltas$;
