-- Recounts every counter from what it counts and returns each row that differs. No rows: the
-- counters are consistent. Reads every table in full: an operator's tool, not a hot path.
WITH work AS (
    -- Every job step's counts, and for the times last worked also those of the steps of pruned
    -- jobs, which the fair order's rows still say.
    SELECT username, service, component, tenant, actor, paused, ready_count, running_count,
           last_worked
      FROM user_work
    UNION ALL
    SELECT username, service, component, tenant, actor, false, 0, 0, last_worked
      FROM pruned_work
), item_counts AS (
    SELECT job_id,
           step_index,
           component,
           count(*) FILTER (WHERE status = 'ready') AS ready,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'successful') AS successful,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'canceled') AS canceled
      FROM work_items
     GROUP BY job_id, step_index, component
), step_counts AS (
    SELECT uw.job_id,
           uw.step_index,
           uw.component,
           jsonb_build_object(
               'ready_count', uw.ready_count, 'scheduled_count', uw.scheduled_count,
               'running_count', uw.running_count,
               'successful_count', uw.successful_count, 'failed_count', uw.failed_count,
               'canceled_count', uw.canceled_count, 'paused', uw.paused,
               'order_worked', uw.order_worked
           ) AS recorded,
           jsonb_build_object(
               'ready_count', coalesce(ic.ready, 0), 'scheduled_count', coalesce(ic.scheduled, 0),
               'running_count', coalesce(ic.running, 0),
               'successful_count', coalesce(ic.successful, 0), 'failed_count', coalesce(ic.failed, 0),
               'canceled_count', coalesce(ic.canceled, 0), 'paused', j.status = 'paused',
               -- The order between a user's claimable steps: last_worked wherever the node has
               -- two or more (a lone step's may lag; see track_claimable_step).
               'order_worked', CASE WHEN uw.claimable AND uw.node_claimable >= 2
                                    THEN uw.last_worked ELSE uw.order_worked END
           ) AS actual
      FROM (SELECT uw.*,
                   count(*) FILTER (WHERE uw.claimable)
                       OVER (PARTITION BY uw.service, uw.component, uw.tenant, uw.username,
                                          uw.actor) AS node_claimable
              FROM user_work uw) uw
      JOIN jobs j ON j.job_id = uw.job_id
      LEFT JOIN item_counts ic
             ON (ic.job_id, ic.step_index, ic.component) = (uw.job_id, uw.step_index, uw.component)
), user_totals AS (
    SELECT username, sum(running_count) AS running, max(last_worked) AS last_worked
      FROM work
     GROUP BY username
), user_counts AS (
    SELECT u.username,
           jsonb_build_object('running_count', u.running_count, 'last_worked', u.last_worked) AS recorded,
           jsonb_build_object('running_count', coalesce(t.running, 0), 'last_worked', t.last_worked) AS actual
      FROM users u
      LEFT JOIN user_totals t ON t.username = u.username
), claimable AS (
    SELECT username, service, component, tenant,
           coalesce(sum(ready_count) FILTER (WHERE NOT paused), 0) AS ready,
           coalesce(sum(ready_count) FILTER (WHERE NOT paused AND actor = '{}'), 0) AS local_ready,
           coalesce(sum(running_count) FILTER (WHERE actor = '{}'), 0) AS local_running,
           max(last_worked) FILTER (WHERE actor = '{}') AS local_last_worked
      FROM work
     GROUP BY username, service, component, tenant
), queue_counts AS (
    SELECT service,
           component,
           tenant,
           username,
           jsonb_build_object(
               'ready_count', su.ready_count, 'running_count', su.running_count,
               'last_worked', su.last_worked, 'local_ready', su.local_ready,
               'local_running', su.local_running, 'local_last_worked', su.local_last_worked,
               'weight', su.weight, 'max_running', su.max_running, 'throttled', su.throttled,
               'tier', su.tier
           ) AS recorded,
           -- The copies of the user's counts may lag the users row (a claim moves only the
           -- queue it claims from), never lead it. The weight and cap are copied whenever they
           -- change; a row may not know yet that its user's bucket emptied, but one that says
           -- so of a user whose bucket has refilled would keep the user out of the order.
           jsonb_build_object(
               'ready_count', coalesce(c.ready, 0),
               'running_count', CASE WHEN su.running_count <= u.running_count
                                     THEN su.running_count ELSE u.running_count END,
               'last_worked', CASE WHEN su.last_worked IS NULL
                                     OR su.last_worked <= u.last_worked
                                   THEN su.last_worked ELSE u.last_worked END,
               'local_ready', coalesce(c.local_ready, 0),
               'local_running', coalesce(c.local_running, 0),
               'local_last_worked', c.local_last_worked,
               'weight', u.weight, 'max_running', u.max_running,
               'throttled', su.throttled AND u.throttled_until IS NOT NULL, 'tier', u.tier
           ) AS actual
      FROM service_users su
      FULL JOIN claimable c USING (service, component, tenant, username)
      LEFT JOIN users u USING (username)
), actor_totals AS (
    -- Each job's step counts, once for every node on its actor path.
    SELECT uw.username, uw.service, uw.component, uw.tenant, uw.actor[1:depth] AS path,
           coalesce(sum(uw.ready_count) FILTER (WHERE NOT uw.paused), 0) AS ready,
           sum(uw.running_count) AS running,
           max(uw.last_worked) AS last_worked,
           coalesce(sum(uw.ready_count)
                        FILTER (WHERE NOT uw.paused AND cardinality(uw.actor) = depth), 0)
               AS local_ready,
           coalesce(sum(uw.running_count) FILTER (WHERE cardinality(uw.actor) = depth), 0)
               AS local_running,
           max(uw.last_worked) FILTER (WHERE cardinality(uw.actor) = depth) AS local_last_worked
      FROM work uw
     CROSS JOIN LATERAL generate_series(1, cardinality(uw.actor)) AS depth
     GROUP BY uw.username, uw.service, uw.component, uw.tenant, uw.actor[1:depth]
), actor_counts AS (
    SELECT username, service, component, tenant, path,
           jsonb_build_object(
               'ready_count', a.ready_count, 'running_count', a.running_count,
               'last_worked', a.last_worked, 'local_ready', a.local_ready,
               'local_running', a.local_running, 'local_last_worked', a.local_last_worked
           ) AS recorded,
           jsonb_build_object(
               'ready_count', coalesce(t.ready, 0), 'running_count', coalesce(t.running, 0),
               'last_worked', t.last_worked, 'local_ready', coalesce(t.local_ready, 0),
               'local_running', coalesce(t.local_running, 0),
               'local_last_worked', t.local_last_worked
           ) AS actual
      FROM actor_queues a
      FULL JOIN actor_totals t USING (username, service, component, tenant, path)
), unlisted_tenants AS (
    -- Claims find a tenant's work only through an active tenant_queues row.
    SELECT DISTINCT c.service, c.component, c.tenant
      FROM claimable c
     WHERE c.ready > 0
       AND NOT EXISTS (
               SELECT 1
                 FROM tenant_queues tq
                WHERE (tq.service, tq.component, tq.tenant) = (c.service, c.component, c.tenant)
                  AND tq.active
           )
), tenant_weights AS (
    -- Each tenant queue orders by its tenant's weight and tier, copied whenever they change.
    SELECT tq.service, tq.component, tq.tenant,
           jsonb_build_object('weight', tq.weight, 'tier', tq.tier) AS recorded,
           jsonb_build_object('weight', t.weight, 'tier', t.tier) AS actual
      FROM tenant_queues tq
      JOIN tenants t ON t.tenant = tq.tenant
), turns_ahead AS (
    -- A pass is a turn's start plus a stride of at most 1000000, and no turn starts past its
    -- order's clock: a pass further ahead says a clock went back or was never written, and
    -- the row would wait behind its order's other rows for as long.
    SELECT 'service_users' AS counter,
           jsonb_build_object('service', su.service, 'component', su.component,
                              'tenant', su.tenant, 'user', su.username) AS key,
           jsonb_build_object('pass', su.pass) AS recorded,
           jsonb_build_object('clock', fc.clock) AS actual
      FROM service_users su
      LEFT JOIN fair_clocks fc
        ON (fc.service, fc.component, fc.tenant) = (su.service, su.component, su.tenant)
     WHERE su.pass > coalesce(fc.clock, 0) + 1000000
    UNION ALL
    SELECT 'tenant_queues',
           jsonb_build_object('service', tq.service, 'component', tq.component,
                              'tenant', tq.tenant),
           jsonb_build_object('pass', tq.pass),
           jsonb_build_object('clock', fc.clock)
      FROM tenant_queues tq
      LEFT JOIN fair_clocks fc
        ON (fc.service, fc.component) = (tq.service, tq.component) AND fc.tenant IS NULL
     WHERE tq.pass > coalesce(fc.clock, 0) + 1000000
), strategy_actual AS (
    -- Running items per (service, metadata key, value), counted from the items.
    SELECT uw.service, m.key, m.value, count(*)::integer AS running
      FROM work_items wi
      JOIN user_work uw
        ON (uw.job_id, uw.step_index, uw.component) = (wi.job_id, wi.step_index, wi.component)
      JOIN job_metadata m ON m.job_id = wi.job_id
     WHERE wi.status = 'running'
     GROUP BY uw.service, m.key, m.value
), strategy_recorded AS (
    -- Each row's count plus its changes logged but not yet folded.
    SELECT r.service, r.key, r.value,
           r.running + coalesce((SELECT sum(c.running)
                                   FROM strategy_running_changes c
                                  WHERE (c.service, c.key, c.value) = (r.service, r.key, r.value)),
                                0)::integer AS running
      FROM strategy_running r
), strategy_counts AS (
    SELECT coalesce(r.service, a.service) AS service, coalesce(r.key, a.key) AS key,
           coalesce(r.value, a.value) AS value,
           jsonb_build_object('running', r.running) AS recorded,
           jsonb_build_object('running', coalesce(a.running, 0)) AS actual
      FROM strategy_recorded r
      FULL JOIN strategy_actual a
             ON (a.service, a.key, a.value) = (r.service, r.key, r.value)
), claimable_counts AS (
    -- A claimable_steps row exactly for each step with ready items that is not paused, with
    -- a claimable_step_metadata row per metadata key of its job.
    SELECT coalesce(uw.job_id, cs.job_id) AS job_id,
           coalesce(uw.step_index, cs.step_index) AS step_index,
           coalesce(uw.component, cs.component) AS component,
           jsonb_build_object('claimable', cs.job_id IS NOT NULL,
                              'metadata_rows', (SELECT count(*)
                                                  FROM claimable_step_metadata cm
                                                 WHERE (cm.job_id, cm.step_index, cm.component)
                                                       = (cs.job_id, cs.step_index, cs.component)))
               AS recorded,
           jsonb_build_object('claimable', uw.job_id IS NOT NULL,
                              'metadata_rows', CASE WHEN uw.job_id IS NULL THEN 0
                                                    ELSE (SELECT count(*)
                                                            FROM job_metadata m
                                                           WHERE m.job_id = uw.job_id) END)
               AS actual
      FROM (SELECT * FROM user_work WHERE claimable) uw
      FULL JOIN claimable_steps cs
             ON (cs.job_id, cs.step_index, cs.component) = (uw.job_id, uw.step_index, uw.component)
)
SELECT 'user_work' AS table_name,
       jsonb_build_object('job_id', job_id, 'step', step_index, 'component', component) AS row_key,
       recorded,
       actual
  FROM step_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'users', jsonb_build_object('user', username), recorded, actual
  FROM user_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'service_users',
       jsonb_build_object('service', service, 'component', component, 'tenant', tenant,
                          'user', username),
       recorded,
       actual
  FROM queue_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'actor_queues',
       jsonb_build_object('service', service, 'component', component, 'tenant', tenant,
                          'user', username, 'actor', path),
       recorded,
       actual
  FROM actor_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'tenant_queues',
       jsonb_build_object('service', service, 'component', component, 'tenant', tenant),
       jsonb_build_object('active', false),
       jsonb_build_object('active', true)
  FROM unlisted_tenants
UNION ALL
SELECT 'tenant_queues',
       jsonb_build_object('service', service, 'component', component, 'tenant', tenant),
       recorded,
       actual
  FROM tenant_weights
 WHERE recorded <> actual
UNION ALL
SELECT counter, key, recorded, actual
  FROM turns_ahead
UNION ALL
SELECT 'strategy_running',
       jsonb_build_object('service', service, 'key', key, 'value', value),
       recorded,
       actual
  FROM strategy_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'claimable_steps',
       jsonb_build_object('job_id', job_id, 'step', step_index, 'component', component),
       recorded,
       actual
  FROM claimable_counts
 WHERE recorded <> actual;
