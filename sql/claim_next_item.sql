-- Hands out the next work item of service $1 to worker slot $3 of querier $2, leased for $4
-- milliseconds. No row: nothing claimable for this querier is free (none exists, or every user
-- with it is held by another transaction; the broker tells which and waits without holding a
-- connection). One row with `stale`: the chosen user was served since this statement's
-- snapshot was taken, so nothing was claimed and the broker looks again at once. Otherwise one
-- row: the claimed item.
--
-- 1. Component: the components with claimable work for the service, in name order, are visited
--    starting at the worker's slot modulo their number, wrapping, until one yields a user.
-- 2. Tenant, within the component: active tenant_queues rows in order of work in progress, then
--    least recently worked, keeping tenants sharded to other queriers out.
-- 3. User, within the tenant: the first user in service_users_fair_order (least work in
--    progress over all services, then least recently worked) whose users row is free. SKIP
--    LOCKED sends a concurrent claimer on to the next user, tenant or component instead of
--    queueing behind the first.
-- 4. That user's best job step (synchronous first, then least recently worked), then the step's
--    lowest ready item of the component.
-- 5. The item is leased, and user_work, users and every service_users row of the user are
--    brought up to date in this same statement, so the counters never drift; the tenant's
--    scheduling hint too, unless another claim holds it.
--
-- Each level is a LIMIT 1 over rows read in index order (LATERAL for the nesting), so the
-- executor stops at the first hit: a claim costs a few index probes, however many tenants,
-- users and items wait.
WITH RECURSIVE components AS (
    -- A skip scan: one probe per component, not one row per waiting user.
    (SELECT su.component
       FROM service_users su
      WHERE su.service = $1
        AND su.ready_count > 0
      ORDER BY su.component
      LIMIT 1)
    UNION ALL
    SELECT (SELECT su.component
              FROM service_users su
             WHERE su.service = $1
               AND su.ready_count > 0
               AND su.component > c.component
             ORDER BY su.component
             LIMIT 1)
      FROM components c
     WHERE c.component IS NOT NULL
), component_names AS (
    SELECT array_agg(component ORDER BY component) AS names
      FROM components
     WHERE component IS NOT NULL
), visits AS (
    SELECT cn.names[1 + ($3::integer + turn) % cardinality(cn.names)] AS component
      FROM component_names cn,
           generate_series(0, cardinality(cn.names) - 1) AS turn
), chosen_user AS (
    -- The order comes from the snapshot; the users row is the latest version once locked. Its
    -- copies in service_users differ exactly when a claim or completion for this user
    -- committed after the snapshot: then the user's place in the order is out of date, and
    -- serving it now could give it two turns in a row.
    SELECT pick.username, pick.tenant, v.component, pick.stale
      FROM visits v
     CROSS JOIN LATERAL (
           SELECT best.username, tq.tenant, best.stale
             FROM tenant_queues tq
             JOIN tenants t ON t.tenant = tq.tenant
            CROSS JOIN LATERAL (
                  SELECT u.username,
                         u.running_count IS DISTINCT FROM su.running_count
                             OR u.last_worked IS DISTINCT FROM su.last_worked AS stale
                    FROM service_users su
                    JOIN users u ON u.username = su.username
                   WHERE su.service = $1
                     AND su.component = tq.component
                     AND su.tenant = tq.tenant
                     AND su.ready_count > 0
                   ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
                   LIMIT 1
                     FOR NO KEY UPDATE OF u SKIP LOCKED
                  ) best
            WHERE tq.service = $1
              AND tq.component = v.component
              AND tq.active
              AND (NOT t.sharded
                   -- A scalar subquery, not EXISTS: the planner keeps it a primary-key
                   -- probe per tenant instead of hashing every shard row of the querier.
                   OR (SELECT true
                         FROM tenant_shards ts
                        WHERE ts.tenant = tq.tenant
                          AND ts.querier = $2))
            ORDER BY tq.running_count, tq.last_worked NULLS FIRST, tq.tenant
            LIMIT 1
           ) pick
     -- No ORDER BY: visits come out of generate_series in turn order, and the first hit ends
     -- the scan. Sorting would evaluate (and lock a user in) every component first.
     LIMIT 1
), own AS (
    -- The chosen user's row for this queue: its own jobs' counts (no actor path).
    SELECT su.username, su.component, su.tenant, su.local_ready, su.local_running,
           su.local_last_worked
      FROM service_users su
     WHERE (su.username, su.service, su.component, su.tenant)
           = (SELECT username, $1, component, tenant FROM chosen_user WHERE NOT stale)
), path_1 AS (
    -- Down the actor tree, a level at a time: a node's best child actor goes before the node's
    -- own jobs when it has less work in progress, or as much and was worked less recently.
    -- NULL last_worked counts as longest ago. `settled`: the node's own jobs won.
    SELECT coalesce(child.path, '{}') AS path, child.path IS NULL AS settled
      FROM own
      LEFT JOIN LATERAL (
            SELECT a.path, a.running_count, a.last_worked
              FROM actor_queues a
             WHERE (a.username, a.service, a.component, a.tenant, a.parent)
                   = (own.username, $1, own.component, own.tenant, '{}')
               AND a.ready_count > 0
             ORDER BY a.running_count, a.last_worked NULLS FIRST, a.path
             LIMIT 1
           ) child
        ON own.local_ready = 0
        OR (child.running_count, coalesce(child.last_worked, '-infinity'))
           < (own.local_running, coalesce(own.local_last_worked, '-infinity'))
), path_2 AS (
    SELECT coalesce(child.path, p.path) AS path, p.settled OR child.path IS NULL AS settled
      FROM path_1 p
      JOIN own ON true
      LEFT JOIN actor_queues node
        ON (node.username, node.service, node.component, node.tenant, node.path)
           = (own.username, $1, own.component, own.tenant, p.path)
       AND NOT p.settled
      LEFT JOIN LATERAL (
            SELECT a.path, a.running_count, a.last_worked
              FROM actor_queues a
             WHERE (a.username, a.service, a.component, a.tenant, a.parent)
                   = (own.username, $1, own.component, own.tenant, node.path)
               AND a.ready_count > 0
             ORDER BY a.running_count, a.last_worked NULLS FIRST, a.path
             LIMIT 1
           ) child
        ON node.local_ready = 0
        OR (child.running_count, coalesce(child.last_worked, '-infinity'))
           < (node.local_running, coalesce(node.local_last_worked, '-infinity'))
), chosen_path AS (
    SELECT coalesce(child.path, p.path) AS path
      FROM path_2 p
      JOIN own ON true
      LEFT JOIN actor_queues node
        ON (node.username, node.service, node.component, node.tenant, node.path)
           = (own.username, $1, own.component, own.tenant, p.path)
       AND NOT p.settled
      LEFT JOIN LATERAL (
            SELECT a.path, a.running_count, a.last_worked
              FROM actor_queues a
             WHERE (a.username, a.service, a.component, a.tenant, a.parent)
                   = (own.username, $1, own.component, own.tenant, node.path)
               AND a.ready_count > 0
             ORDER BY a.running_count, a.last_worked NULLS FIRST, a.path
             LIMIT 1
           ) child
        ON node.local_ready = 0
        OR (child.running_count, coalesce(child.last_worked, '-infinity'))
           < (node.local_running, coalesce(node.local_last_worked, '-infinity'))
), chosen_step AS (
    -- Compared with scalar subqueries rather than joined, so that the index's leading columns
    -- are bound and it yields rows already in order: no sort of the user's jobs or the job's
    -- items, however many there are.
    SELECT uw.job_id, uw.step_index, uw.component, uw.tenant, uw.actor,
           CASE WHEN cardinality(uw.actor) = 0 THEN 1 ELSE 0 END AS own_job
      FROM user_work uw
     WHERE uw.service = $1
       AND uw.component = (SELECT component FROM own)
       AND uw.tenant = (SELECT tenant FROM own)
       AND uw.username = (SELECT username FROM own)
       AND uw.actor = (SELECT path FROM chosen_path)
       AND uw.ready_count > 0
       AND NOT uw.paused
     ORDER BY uw.is_async, uw.last_worked NULLS FIRST, uw.job_id, uw.step_index
     LIMIT 1
), chosen_item AS (
    SELECT wi.id
      FROM work_items wi
     WHERE wi.job_id = (SELECT job_id FROM chosen_step)
       AND wi.step_index = (SELECT step_index FROM chosen_step)
       AND wi.component = (SELECT component FROM chosen_step)
       AND wi.status = 'ready'
     ORDER BY wi.id
     LIMIT 1
       FOR NO KEY UPDATE OF wi SKIP LOCKED
), claimed AS (
    UPDATE work_items wi
       SET status = 'running',
           attempt = wi.attempt + 1,
           lease_expires_at = now() + $4::bigint * interval '1 millisecond',
           querier = $2,
           worker = $3,
           updated_at = now()
      FROM chosen_item ci
     WHERE wi.id = ci.id
 RETURNING wi.id, wi.job_id, wi.step_index, wi.component, wi.payload, wi.inputs, wi.attempt,
           wi.lease_expires_at
), worked_at AS MATERIALIZED (
    -- One instant for every row this claim touches, so users.last_worked equals the newest
    -- user_work.last_worked (the consistency check relies on it).
    SELECT clock_timestamp() AS at
), step_counts AS (
    UPDATE user_work uw
       SET ready_count = uw.ready_count - 1,
           running_count = uw.running_count + 1,
           last_worked = worked_at.at
      FROM claimed, worked_at
     WHERE uw.job_id = claimed.job_id
       AND uw.step_index = claimed.step_index
       AND uw.component = claimed.component
), user_counts AS (
    UPDATE users u
       SET running_count = u.running_count + 1,
           last_worked = worked_at.at
      FROM chosen_user cu, claimed, worked_at
     WHERE u.username = cu.username
 RETURNING u.username, u.running_count, u.last_worked
), queue_counts AS (
    -- Every row of the user takes the new copies; the claimed queue's row also its counts, and
    -- its own-jobs counts when the job has no actor path (`own_job`: 1 or 0).
    UPDATE service_users su
       SET running_count = uc.running_count,
           last_worked = uc.last_worked,
           ready_count = su.ready_count - 1,
           local_ready = su.local_ready - cs.own_job,
           local_running = su.local_running + cs.own_job,
           local_last_worked = CASE WHEN cs.own_job = 1 THEN uc.last_worked
                                    ELSE su.local_last_worked END
      FROM user_counts uc, chosen_step cs
     WHERE (su.username, su.service, su.component, su.tenant)
           = (uc.username, $1, cs.component, cs.tenant)
 RETURNING su.username
), other_queues AS (
    UPDATE service_users su
       SET running_count = uc.running_count,
           last_worked = uc.last_worked
      FROM user_counts uc, chosen_step cs
     WHERE su.username = uc.username
       AND (su.service, su.component, su.tenant) <> ($1, cs.component, cs.tenant)
), actor_counts AS (
    -- Every node on the claimed job's actor path: its subtree, and its own jobs at the end.
    UPDATE actor_queues a
       SET ready_count = a.ready_count - 1,
           running_count = a.running_count + 1,
           last_worked = uc.last_worked,
           local_ready = a.local_ready - CASE WHEN a.path = cs.actor THEN 1 ELSE 0 END,
           local_running = a.local_running + CASE WHEN a.path = cs.actor THEN 1 ELSE 0 END,
           local_last_worked = CASE WHEN a.path = cs.actor THEN uc.last_worked
                                    ELSE a.local_last_worked END
      FROM user_counts uc, chosen_step cs
     WHERE (a.username, a.service, a.component, a.tenant)
           = (uc.username, $1, cs.component, cs.tenant)
       AND (a.path = cs.actor[1:1] OR a.path = cs.actor[1:2] OR a.path = cs.actor[1:3])
), tenant_turn AS (
    -- After queue_counts (it reads its output), keeping the lock order.
    UPDATE tenant_queues tq
       SET running_count = tq.running_count + 1,
           last_worked = worked_at.at
      FROM chosen_user cu, worked_at
     WHERE tq.service = $1
       AND tq.component = cu.component
       AND tq.tenant = cu.tenant
       AND (SELECT true
              FROM tenant_queues hint
             WHERE (hint.service, hint.component, hint.tenant)
                   = (tq.service, tq.component, tq.tenant)
               AND EXISTS (SELECT 1 FROM queue_counts)
               FOR NO KEY UPDATE SKIP LOCKED)
), job_started AS (
    UPDATE jobs j
       SET status = 'running', updated_at = now()
      FROM claimed
     WHERE j.job_id = claimed.job_id
       AND j.status = 'accepted'
)
SELECT cu.stale,
       cu.username,
       claimed.id,
       claimed.job_id,
       claimed.step_index,
       claimed.component,
       claimed.payload,
       claimed.inputs,
       claimed.attempt,
       claimed.lease_expires_at,
       cs.tenant,
       cs.actor
  FROM chosen_user cu
  LEFT JOIN claimed ON true
  LEFT JOIN chosen_step cs ON claimed.id IS NOT NULL;
