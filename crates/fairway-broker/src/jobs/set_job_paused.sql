-- Pauses ($2 true) or resumes ($2 false) job $1's steps: their ready items leave or rejoin the
-- claimable counts of the user's queues and actor nodes. Resuming marks the tenants' queues
-- active (see apply_step_deltas). Returns each service whose claimable count changed.
WITH steps AS (
    UPDATE user_work
       SET paused = $2
     WHERE job_id = $1
       AND paused <> $2
 RETURNING username, service, component, tenant, actor, ready_count
), per_queue AS (
    -- One job, so one actor path for all its rows.
    SELECT username, service, component, tenant, actor,
           CASE WHEN $2 THEN -1 ELSE 1 END * sum(ready_count)::integer AS delta
      FROM steps
     GROUP BY username, service, component, tenant, actor
), queue_counts AS (
    UPDATE service_users su
       SET ready_count = su.ready_count + pq.delta,
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
    INSERT INTO tenant_queues AS tq (service, component, tenant, weight)
    SELECT DISTINCT pq.service, pq.component, pq.tenant, t.weight
      FROM per_queue pq
      JOIN tenants t ON t.tenant = pq.tenant
     WHERE pq.delta > 0
       AND EXISTS (SELECT 1 FROM queue_counts)
     ORDER BY pq.service, pq.component, pq.tenant
        ON CONFLICT (service, component, tenant) DO UPDATE SET active = true
)
SELECT DISTINCT pq.service
  FROM per_queue pq
 WHERE pq.delta > 0;
