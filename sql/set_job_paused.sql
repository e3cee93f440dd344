-- Pauses ($2 true) or resumes ($2 false) job $1's steps: their ready items leave or rejoin the
-- user's claimable counts. Resuming marks the tenants' queues active (see apply_step_deltas).
-- Returns each service whose claimable count changed.
WITH steps AS (
    UPDATE user_work
       SET paused = $2
     WHERE job_id = $1
       AND paused <> $2
 RETURNING username, service, component, tenant, ready_count
), per_queue AS (
    SELECT username, service, component, tenant, sum(ready_count)::integer AS ready
      FROM steps
     GROUP BY username, service, component, tenant
), queue_counts AS (
    UPDATE service_users su
       SET ready_count = su.ready_count + CASE WHEN $2 THEN -pq.ready ELSE pq.ready END
      FROM per_queue pq
     WHERE (su.username, su.service, su.component, su.tenant)
           = (pq.username, pq.service, pq.component, pq.tenant)
 RETURNING su.service
), tenants_activated AS (
    INSERT INTO tenant_queues AS tq (service, component, tenant)
    SELECT DISTINCT pq.service, pq.component, pq.tenant
      FROM per_queue pq
     WHERE NOT $2
       AND pq.ready > 0
       AND EXISTS (SELECT 1 FROM queue_counts)
        ON CONFLICT (service, component, tenant) DO UPDATE SET active = true
)
SELECT DISTINCT pq.service
  FROM per_queue pq
 WHERE pq.ready > 0;
