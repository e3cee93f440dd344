-- Brings every counter in line with freshly seeded or reset work items: the broker's own
-- (user_work, users, service_users, tenant_queues and its log of changes; seeded jobs have no
-- actor path) and Harmony's, all idle and never worked. Each step reads its items from its
-- first, as a submitted step does (create_step_queues.sql).
UPDATE jobs SET status = 'accepted';
UPDATE user_work uw
   SET ready_count = c.ready, running_count = 0, successful_count = 0, failed_count = 0,
       canceled_count = 0, last_worked = NULL, order_worked = NULL, ready_from = c.first
  FROM (SELECT job_id, step_index, component, count(*)::integer AS ready, min(id) AS first
          FROM work_items GROUP BY job_id, step_index, component) c
 WHERE (c.job_id, c.step_index, c.component) = (uw.job_id, uw.step_index, uw.component);
-- Buckets full again: a rate-limited user starts each path as it started the first.
UPDATE users SET running_count = 0, last_worked = NULL, next_free = NULL, throttled_until = NULL;
-- The strategies' running counts: idle, with nothing logged (the update above logged the
-- previous path's running items going).
TRUNCATE strategy_running_changes;
UPDATE strategy_running SET running = 0;
UPDATE service_users su
   SET ready_count = c.ready, running_count = 0, last_worked = NULL,
       local_ready = c.ready, local_running = 0, local_last_worked = NULL, throttled = false,
       lone_job_id = NULL, lone_step_index = NULL
  FROM (SELECT service, component, tenant, username, sum(ready_count)::integer AS ready
          FROM user_work GROUP BY service, component, tenant, username) c
 WHERE (c.service, c.component, c.tenant, c.username)
       = (su.service, su.component, su.tenant, su.username);
DELETE FROM tenant_queues;
-- Changes a previous path logged would otherwise be folded into the fresh counts.
TRUNCATE tenant_running_changes;
INSERT INTO tenant_queues (service, component, tenant, weight)
SELECT DISTINCT su.service, su.component, su.tenant, t.weight
  FROM service_users su
  JOIN tenants t ON t.tenant = su.tenant
 WHERE su.ready_count > 0;
DELETE FROM queriers;
TRUNCATE harmony_user_work;
INSERT INTO harmony_user_work (job_id, service_id, username, is_async, ready_count, last_worked)
SELECT job_id, service, username, is_async, ready_count, '2000-01-01'
  FROM user_work;
TRUNCATE bench_seed;
INSERT INTO bench_seed SELECT coalesce(max(id), 0) + 1 FROM work_items;
