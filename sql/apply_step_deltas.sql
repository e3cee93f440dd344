-- Moves the item counts of job $1's step $2, component $3, by the deltas $4 ready, $5 running,
-- $6 successful, $7 failed, $8 canceled, and keeps the user's users, service_users and
-- actor_queues rows in step, in the transaction that moved the items. The caller holds the
-- user's users row, and has created the rows (create_step_queues.sql). Returns the step's service; whether the user's
-- claimable work for it went from none to some (only then can a worker of the service be
-- waiting, so only then is a notification worth its commit-time lock); and how many items of
-- the whole job are still ready or running.
--
-- The tenant's hint row: made active, under its lock, when the user's work became claimable,
-- so that the reaper cannot retire it meanwhile; otherwise its running count follows when no
-- claim holds it (see tenant_queues in V2).
WITH step AS (
    UPDATE user_work
       SET ready_count = ready_count + $4,
           running_count = running_count + $5,
           successful_count = successful_count + $6,
           failed_count = failed_count + $7,
           canceled_count = canceled_count + $8
     WHERE job_id = $1
       AND step_index = $2
       AND component = $3
 RETURNING username, service, component, tenant, actor, paused, ready_count, running_count
), user_counts AS (
    UPDATE users u
       SET running_count = u.running_count + $5
      FROM step
     WHERE u.username = step.username
       AND $5 <> 0
 RETURNING u.username, u.running_count
), queue_counts AS (
    -- The step's queue row moves by the deltas, its own-jobs counts too when the job has no
    -- actor path; it and every other row of the user take the new running copy.
    UPDATE service_users su
       SET running_count = coalesce(uc.running_count, su.running_count),
           ready_count = su.ready_count + CASE WHEN step.paused THEN 0 ELSE $4 END,
           local_ready = su.local_ready
               + CASE WHEN cardinality(step.actor) = 0 AND NOT step.paused THEN $4 ELSE 0 END,
           local_running = su.local_running
               + CASE WHEN cardinality(step.actor) = 0 THEN $5 ELSE 0 END
      FROM step
      LEFT JOIN user_counts uc ON true
     WHERE (su.username, su.service, su.component, su.tenant)
           = (step.username, step.service, step.component, step.tenant)
 RETURNING su.service, su.component, su.tenant, su.ready_count
), other_queues AS (
    UPDATE service_users su
       SET running_count = uc.running_count
      FROM step, user_counts uc
     WHERE su.username = step.username
       AND (su.service, su.component, su.tenant) <> (step.service, step.component, step.tenant)
), actor_counts AS (
    -- Every node on the job's actor path: its subtree, and its own jobs at the end.
    UPDATE actor_queues a
       SET ready_count = a.ready_count + CASE WHEN step.paused THEN 0 ELSE $4 END,
           running_count = a.running_count + $5,
           local_ready = a.local_ready
               + CASE WHEN a.path = step.actor AND NOT step.paused THEN $4 ELSE 0 END,
           local_running = a.local_running + CASE WHEN a.path = step.actor THEN $5 ELSE 0 END
      FROM step
     WHERE (a.username, a.service, a.component, a.tenant)
           = (step.username, step.service, step.component, step.tenant)
       AND (a.path = step.actor[1:1] OR a.path = step.actor[1:2] OR a.path = step.actor[1:3])
       AND ($4 <> 0 OR $5 <> 0)
), became_claimable AS (
    SELECT EXISTS (
               SELECT 1
                 FROM queue_counts qc, step
                WHERE (qc.service, qc.component, qc.tenant)
                      = (step.service, step.component, step.tenant)
                  AND qc.ready_count > 0
                  AND qc.ready_count <= $4
           ) AS yes
), tenant_activated AS (
    INSERT INTO tenant_queues AS tq (service, component, tenant, running_count)
    SELECT step.service, step.component, step.tenant, greatest($5, 0)
      FROM step, became_claimable
     WHERE became_claimable.yes
        ON CONFLICT (service, component, tenant) DO UPDATE
       SET active = true,
           running_count = greatest(tq.running_count + $5, 0)
), tenant_hint AS (
    UPDATE tenant_queues tq
       SET running_count = greatest(tq.running_count + $5, 0)
      FROM step, became_claimable
     WHERE NOT became_claimable.yes
       AND $5 <> 0
       AND (tq.service, tq.component, tq.tenant) = (step.service, step.component, step.tenant)
       AND (SELECT true
              FROM tenant_queues hint
             WHERE (hint.service, hint.component, hint.tenant)
                   = (tq.service, tq.component, tq.tenant)
               FOR NO KEY UPDATE SKIP LOCKED)
)
SELECT step.service,
       (SELECT yes FROM became_claimable) AS became_claimable,
       step.ready_count + step.running_count + (
           SELECT coalesce(sum(other.ready_count + other.running_count), 0)
             FROM user_work other
            WHERE other.job_id = $1
              AND (other.step_index, other.component) <> ($2, $3)
       )::integer AS job_open_items
  FROM step;
