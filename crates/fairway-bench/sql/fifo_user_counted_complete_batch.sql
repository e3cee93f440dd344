-- The user-counted FIFO's completions (fifo_user_counted_claim.sql): every item of one gathered
-- batch, and every queue row of each owner once, by the owner's sum, in one statement.
WITH done AS (
    UPDATE work_items
       SET status = 'successful', results = '[]', lease_expires_at = NULL, updated_at = now()
     WHERE id = ANY($1)
    RETURNING job_id
), owners AS (
    SELECT j.username, count(*)::integer AS items
      FROM done
      JOIN jobs j ON j.job_id = done.job_id
     GROUP BY j.username
), owner_locks AS (
    SELECT su.username, su.service, su.component, su.tenant
      FROM service_users su
     WHERE su.username = ANY (ARRAY(SELECT username FROM owners))
     ORDER BY su.username, su.service, su.component, su.tenant
       FOR NO KEY UPDATE
)
UPDATE service_users su
   SET running_count = su.running_count - o.items
  FROM owner_locks l
  JOIN owners o ON o.username = l.username
 WHERE (su.username, su.service, su.component, su.tenant)
       = (l.username, l.service, l.component, l.tenant);
