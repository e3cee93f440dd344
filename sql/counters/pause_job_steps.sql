-- pause_job_steps: pauses (p_paused) or resumes a job's steps. A paused step's ready items
-- are not claimable, so they leave (or rejoin) the ready counts of the user's service_users
-- row and its actor path's actor_queues rows; the step rows' own counts stay. Resuming marks
-- the tenants' queues active, as apply_tenant_delta does for work that became claimable.
--
-- Arguments: the job and whether to pause it.
-- Answer: each service whose claimable count rose (resumed work a worker may wait for).
-- Locks: the job's user_work rows, then the queue and actor rows, then tenant_queues rows in
-- key order (as apply_tenant_deltas takes them).

CREATE OR REPLACE FUNCTION pause_job_steps(p_job_id uuid, p_paused boolean)
RETURNS TABLE (service text)
LANGUAGE sql
AS $pause$
    WITH steps AS (
        UPDATE user_work
           SET paused = p_paused
         WHERE job_id = p_job_id
           AND paused <> p_paused
     RETURNING username, service, component, tenant, actor, ready_count
    ), per_queue AS (
        -- One job, so one actor path for all its rows.
        SELECT username, service, component, tenant, actor,
               CASE WHEN p_paused THEN -1 ELSE 1 END * sum(ready_count)::integer AS delta
          FROM steps
         GROUP BY username, service, component, tenant, actor
    ), queue_counts AS (
        UPDATE service_users su
           SET ready_count = su.ready_count + pq.delta,
               fresh = su.fresh OR su.ready_count = 0,
               local_ready = su.local_ready
                   + CASE WHEN cardinality(pq.actor) = 0 THEN pq.delta ELSE 0 END
          FROM per_queue pq
         WHERE (su.username, su.service, su.component, su.tenant)
               = (pq.username, pq.service, pq.component, pq.tenant)
     RETURNING su.service
    ), actor_counts AS (
        UPDATE actor_queues a
           SET ready_count = a.ready_count + pq.delta,
               local_ready = a.local_ready + CASE WHEN a.path = pq.actor THEN pq.delta ELSE 0 END
          FROM per_queue pq
         WHERE (a.username, a.service, a.component, a.tenant)
               = (pq.username, pq.service, pq.component, pq.tenant)
           AND (a.path = pq.actor[1:1] OR a.path = pq.actor[1:2] OR a.path = pq.actor[1:3])
    ), tenants_activated AS (
        -- In key order, as apply_tenant_deltas takes them.
        INSERT INTO tenant_queues AS tq (service, component, tenant, weight, tier)
        SELECT DISTINCT pq.service, pq.component, pq.tenant, t.weight, t.tier
          FROM per_queue pq
          JOIN tenants t ON t.tenant = pq.tenant
         WHERE pq.delta > 0
           AND EXISTS (SELECT 1 FROM queue_counts)
         ORDER BY pq.service, pq.component, pq.tenant
            ON CONFLICT (service, component, tenant) DO UPDATE
           SET active = true, fresh = tq.fresh OR NOT tq.active
    )
    SELECT DISTINCT pq.service
      FROM per_queue pq
     WHERE pq.delta > 0;
$pause$;
