-- The batched FIFO claim that also keeps the counters the fair order reads, as the broker's
-- claim does: the steps' (user_work), their owners' (users) and the owners' queues'
-- (service_users, whose copies of the owner's count and time move on every row of the user).
-- Each counter row moves once per statement by the batch's sum, and the choice costs nothing
-- (oldest first), so this is what any claim that keeps these counters costs at the least. It
-- writes each step's order column (order_worked) as the broker does for a user with two or
-- more claimable steps in the queue.
-- $1 items at most, through an array as in fifo_claim.sql.
WITH item AS (
    UPDATE work_items
       SET status = 'running', attempt = attempt + 1,
           lease_expires_at = now() + interval '5 minutes', updated_at = now()
     WHERE id = ANY (ARRAY(
               SELECT id FROM work_items
                WHERE status = 'ready'
                ORDER BY id
                LIMIT $1
                  FOR UPDATE SKIP LOCKED
           ))
    RETURNING id, job_id, step_index, component
), steps AS (
    SELECT job_id, step_index, component, count(*)::integer AS claimed, max(id) AS last_id
      FROM item
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
       SET ready_count = uw.ready_count - s.claimed,
           running_count = uw.running_count + s.claimed,
           last_worked = now(),
           order_worked = now(),
           ready_from = greatest(uw.ready_from, s.last_id)
      FROM steps s, owner_locks l
     WHERE (uw.job_id, uw.step_index, uw.component) = (s.job_id, s.step_index, s.component)
       AND uw.username = l.username
    RETURNING uw.username, uw.service, uw.component, uw.tenant, uw.actor = '{}' AS own,
              s.claimed
), owners AS (
    SELECT username, sum(claimed)::integer AS claimed
      FROM step_counts
     GROUP BY username
), owner_counts AS (
    UPDATE users u
       SET running_count = u.running_count + o.claimed, last_worked = now()
      FROM owners o
     WHERE u.username = o.username
    RETURNING u.username, u.running_count
), queues AS (
    -- Every queue of each owner, with what this batch claimed from it.
    SELECT su.service, su.component, su.tenant, su.username,
           coalesce(sum(sc.claimed), 0)::integer AS claimed,
           coalesce(sum(sc.claimed) FILTER (WHERE sc.own), 0)::integer AS own
      FROM service_users su
      JOIN owners o ON o.username = su.username
      LEFT JOIN step_counts sc
             ON (sc.username, sc.service, sc.component, sc.tenant)
                = (su.username, su.service, su.component, su.tenant)
     GROUP BY su.service, su.component, su.tenant, su.username
), queue_counts AS (
    UPDATE service_users su
       SET running_count = oc.running_count,
           last_worked = now(),
           ready_count = su.ready_count - q.claimed,
           local_ready = su.local_ready - q.own,
           local_running = su.local_running + q.own,
           local_last_worked = CASE WHEN q.own > 0 THEN now() ELSE su.local_last_worked END
      FROM queues q
      JOIN owner_counts oc ON oc.username = q.username
     WHERE (su.service, su.component, su.tenant, su.username)
           = (q.service, q.component, q.tenant, q.username)
)
SELECT id, job_id FROM item;
