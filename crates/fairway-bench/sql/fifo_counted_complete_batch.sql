-- The counted FIFO's completions (fifo_counted_claim.sql): every item of one gathered batch,
-- and the counters it moves, in one statement, each counter row once.
WITH done AS (
    UPDATE work_items
       SET status = 'successful', results = '[]', lease_expires_at = NULL, updated_at = now()
     WHERE id = ANY($1)
    RETURNING job_id, step_index, component
), steps AS (
    SELECT job_id, step_index, component, count(*)::integer AS ended
      FROM done
     GROUP BY job_id, step_index, component
), owner_locks AS (
    -- The owners' users rows first, in username order, as the broker takes them: every other
    -- counter row of a user is written downstream of its lock here, so that claims and
    -- completions cannot deadlock over them.
    SELECT u.username
      FROM users u
     WHERE u.username IN (
               SELECT uw.username
                 FROM steps s
                 JOIN user_work uw
                   ON (uw.job_id, uw.step_index, uw.component)
                      = (s.job_id, s.step_index, s.component)
           )
     ORDER BY u.username
       FOR NO KEY UPDATE
), step_counts AS (
    UPDATE user_work uw
       SET running_count = uw.running_count - s.ended,
           successful_count = uw.successful_count + s.ended
      FROM steps s, owner_locks l
     WHERE (uw.job_id, uw.step_index, uw.component) = (s.job_id, s.step_index, s.component)
       AND uw.username = l.username
    RETURNING uw.username, uw.service, uw.component, uw.tenant, uw.actor = '{}' AS own,
              s.ended
), owners AS (
    SELECT username, sum(ended)::integer AS ended
      FROM step_counts
     GROUP BY username
), owner_counts AS (
    UPDATE users u
       SET running_count = u.running_count - o.ended
      FROM owners o
     WHERE u.username = o.username
    RETURNING u.username, u.running_count
), queues AS (
    SELECT su.service, su.component, su.tenant, su.username,
           coalesce(sum(sc.ended) FILTER (WHERE sc.own), 0)::integer AS own
      FROM service_users su
      JOIN owners o ON o.username = su.username
      LEFT JOIN step_counts sc
             ON (sc.username, sc.service, sc.component, sc.tenant)
                = (su.username, su.service, su.component, su.tenant)
     GROUP BY su.service, su.component, su.tenant, su.username
)
UPDATE service_users su
   SET running_count = oc.running_count,
       local_running = su.local_running - q.own
  FROM queues q
  JOIN owner_counts oc ON oc.username = q.username
 WHERE (su.service, su.component, su.tenant, su.username)
       = (q.service, q.component, q.tenant, q.username);
