-- The database's gauges for /metrics, taken at most once per $1 milliseconds however many
-- brokers ask: the broker that finds the snapshot older than that takes it again and stores it;
-- any other broker reads the stored one rather than wait for it (SKIP LOCKED).
--
-- Each part reads a small counter table or probes an index, never the backlog:
--   ready: the fair order's per-user counts of claimable items (service_users);
--   running: the running items, through the leases index (one per busy worker);
--   paused: the paused steps' ready counts (the user_work_paused index);
--   scheduled: the steps' scheduled counts (the user_work_scheduled index);
--   oldest_ready: each step with claimable items (user_work_claimable) and its first ready
--     item, one probe of work_items_ready from where the step's claims start reading;
--   active_users: users with ready or running items, per tenant and over all tenants;
--   held_user_cap, held_user_rate: users with claimable work that the fair order leaves out
--     at their cap or with an empty bucket (their service_users rows' in_order);
--   held_tenant_cap, held_tenant_rate: tenants with a policy and active queues of the service
--     at their cap (counted from the leases) or with an empty bucket.
-- Rows: {service, tenant (null: every tenant), measure, value}; oldest_ready is the oldest
-- ready item's creation time, in seconds since the epoch.
WITH due AS (
    SELECT only_row
      FROM metrics_snapshot
     WHERE taken_at <= now() - $1::bigint * interval '1 millisecond'
       FOR UPDATE SKIP LOCKED
), ready AS (
    SELECT service, tenant, username, sum(ready_count) AS items
      FROM service_users
     WHERE ready_count > 0
     GROUP BY service, tenant, username
), running AS (
    SELECT uw.service, uw.tenant, uw.username, count(*) AS items
      FROM work_items wi
      JOIN user_work uw USING (job_id, step_index, component)
     WHERE wi.status = 'running'
     GROUP BY uw.service, uw.tenant, uw.username
), oldest AS (
    SELECT uw.service, uw.tenant, min(first.created_at) AS created_at
      FROM user_work uw
     CROSS JOIN LATERAL (
               SELECT wi.created_at
                 FROM work_items wi
                WHERE (wi.job_id, wi.step_index, wi.component)
                      = (uw.job_id, uw.step_index, uw.component)
                  AND wi.status = 'ready'
                  AND wi.id >= uw.ready_from
                ORDER BY wi.id
                LIMIT 1
           ) first
     WHERE uw.ready_count > 0
       AND NOT uw.paused
     GROUP BY uw.service, uw.tenant
), active AS (
    SELECT service, tenant, username FROM ready
     UNION
    SELECT service, tenant, username FROM running
), gauges AS (
    SELECT service, tenant, 'ready' AS measure, sum(items)::float8 AS value
      FROM ready
     GROUP BY service, tenant
     UNION ALL
    SELECT service, tenant, 'running', sum(items)::float8
      FROM running
     GROUP BY service, tenant
     UNION ALL
    SELECT service, tenant, 'paused', sum(ready_count)::float8
      FROM user_work
     WHERE paused
       AND ready_count > 0
     GROUP BY service, tenant
     UNION ALL
    SELECT service, tenant, 'scheduled', sum(scheduled_count)::float8
      FROM user_work
     WHERE scheduled_count > 0
     GROUP BY service, tenant
     UNION ALL
    SELECT service, tenant, 'oldest_ready', extract(epoch FROM created_at)::float8
      FROM oldest
     UNION ALL
    SELECT service, tenant, 'active_users', count(*)::float8
      FROM active
     GROUP BY GROUPING SETS ((service, tenant), (service))
     UNION ALL
    SELECT su.service, NULL,
           CASE WHEN su.throttled THEN 'held_user_rate' ELSE 'held_user_cap' END,
           count(DISTINCT su.username)::float8
      FROM service_users su
     WHERE su.ready_count > 0
       AND NOT su.in_order
     GROUP BY su.service, su.throttled
     UNION ALL
    SELECT policed.service, NULL, policed.measure, count(*)::float8
      FROM (SELECT DISTINCT tq.service, t.tenant,
                   CASE WHEN t.max_running > 0 AND tenant_running(t.tenant) >= t.max_running
                        THEN 'held_tenant_cap'
                        WHEN t.rate_per_second > 0
                             AND bucket_tokens(t.rate_per_second, t.burst, t.next_free) = 0
                        THEN 'held_tenant_rate'
                   END AS measure
              FROM tenants t
              JOIN tenant_queues tq ON tq.tenant = t.tenant AND tq.active
             WHERE t.max_running > 0 OR t.rate_per_second > 0) policed
     WHERE policed.measure IS NOT NULL
     GROUP BY policed.service, policed.measure
), taken AS (
    UPDATE metrics_snapshot
       SET taken_at = now(),
           gauges = (SELECT coalesce(jsonb_agg(g), '[]') FROM gauges g)
     WHERE only_row IN (SELECT only_row FROM due)
    RETURNING gauges
)
SELECT gauges FROM taken
 UNION ALL
SELECT gauges FROM metrics_snapshot WHERE NOT EXISTS (SELECT FROM taken);
