-- Recounts every counter from what it counts and returns each row that differs. No rows: the
-- counters are consistent. Reads every table in full: an operator's tool, not a hot path.
WITH item_counts AS (
    SELECT job_id,
           step_index,
           count(*) FILTER (WHERE status = 'ready') AS ready,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'successful') AS successful,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'canceled') AS canceled
      FROM work_items
     GROUP BY job_id, step_index
), step_counts AS (
    SELECT uw.job_id,
           uw.step_index,
           jsonb_build_object(
               'ready_count', uw.ready_count, 'running_count', uw.running_count,
               'successful_count', uw.successful_count, 'failed_count', uw.failed_count,
               'canceled_count', uw.canceled_count, 'paused', uw.paused
           ) AS recorded,
           jsonb_build_object(
               'ready_count', coalesce(ic.ready, 0), 'running_count', coalesce(ic.running, 0),
               'successful_count', coalesce(ic.successful, 0), 'failed_count', coalesce(ic.failed, 0),
               'canceled_count', coalesce(ic.canceled, 0), 'paused', j.status = 'paused'
           ) AS actual
      FROM user_work uw
      JOIN jobs j ON j.job_id = uw.job_id
      LEFT JOIN item_counts ic ON ic.job_id = uw.job_id AND ic.step_index = uw.step_index
), user_totals AS (
    SELECT username, sum(running_count) AS running, max(last_worked) AS last_worked
      FROM user_work
     GROUP BY username
), user_counts AS (
    SELECT u.username,
           jsonb_build_object('running_count', u.running_count, 'last_worked', u.last_worked) AS recorded,
           jsonb_build_object('running_count', coalesce(t.running, 0), 'last_worked', t.last_worked) AS actual
      FROM users u
      LEFT JOIN user_totals t ON t.username = u.username
), claimable AS (
    SELECT username, service, coalesce(sum(ready_count) FILTER (WHERE NOT paused), 0) AS ready
      FROM user_work
     GROUP BY username, service
), queue_counts AS (
    SELECT service,
           username,
           jsonb_build_object(
               'ready_count', su.ready_count, 'running_count', su.running_count,
               'last_worked', su.last_worked
           ) AS recorded,
           jsonb_build_object(
               'ready_count', coalesce(c.ready, 0), 'running_count', u.running_count,
               'last_worked', u.last_worked
           ) AS actual
      FROM service_users su
      FULL JOIN claimable c USING (service, username)
      LEFT JOIN users u USING (username)
)
SELECT 'user_work' AS table_name,
       jsonb_build_object('job_id', job_id, 'step', step_index) AS row_key,
       recorded,
       actual
  FROM step_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'users', jsonb_build_object('user', username), recorded, actual
  FROM user_counts
 WHERE recorded <> actual
UNION ALL
SELECT 'service_users', jsonb_build_object('service', service, 'user', username), recorded, actual
  FROM queue_counts
 WHERE recorded <> actual;
