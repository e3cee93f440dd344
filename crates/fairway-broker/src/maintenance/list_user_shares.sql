-- The users with work for service $1, running or claimable: how many of its items each holds
-- running and has ready, and its policy, the $2 with most running first. Running items are found through the
-- leases index (one per busy worker); ready counts come from the fair order's per-user rows.
WITH running AS (
    SELECT uw.username, count(*)::bigint AS running
      FROM work_items wi
      JOIN user_work uw USING (job_id, step_index, component)
     WHERE wi.status = 'running'
       AND uw.service = $1
     GROUP BY uw.username
), ready AS (
    SELECT su.username, sum(su.ready_count)::bigint AS ready
      FROM service_users su
     WHERE su.service = $1
       AND su.ready_count > 0
     GROUP BY su.username
)
SELECT username, coalesce(r.running, 0) AS running, coalesce(q.ready, 0) AS ready,
       u.weight, u.tier::integer AS tier, u.max_running, u.rate_per_second,
       u.max_running > 0 AND u.running_count >= u.max_running AS at_cap,
       u.throttled_until IS NOT NULL AS throttled
  FROM running r
  FULL JOIN ready q USING (username)
  JOIN users u USING (username)
 ORDER BY running DESC, ready DESC, username
 LIMIT $2;
