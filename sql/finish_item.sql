-- Records the outcome $3 ('successful', 'failed' or 'ready' for a retry) of the current attempt
-- $2 of running item $1, with results $4, error $5, and $7 the component its results go on to
-- (NULL: its own). With $6 the update applies only when the lease has expired (the reaper's
-- case). No row: no such item, a stale attempt, or an item that is not running.
--
-- The owner's users row is locked first (the lock order), in the same statement: the item's
-- conditions are rechecked against its latest version after any wait, so a stale snapshot
-- cannot let a canceled or reclaimed attempt through. Also returns what the workflow needs:
-- whether a next step exists and aggregates, and whether any step of the job aggregates.
WITH owner AS (
    SELECT u.username
      FROM users u
     WHERE u.username = (
               SELECT j.username
                 FROM work_items wi
                 JOIN jobs j ON j.job_id = wi.job_id
                WHERE wi.id = $1
           )
       FOR NO KEY UPDATE
)
UPDATE work_items wi
   SET status = $3::text::work_item_status,
       results = $4,
       error = $5,
       next_component = $7,
       lease_expires_at = NULL,
       updated_at = now()
 WHERE wi.id = $1
   AND wi.attempt = $2
   -- Running, spelled so that only the primary key can find the item (see V3).
   AND wi.lease_expires_at IS NOT NULL
   AND (NOT $6 OR wi.lease_expires_at <= now())
   AND EXISTS (SELECT 1 FROM owner)
RETURNING wi.job_id,
          wi.step_index,
          wi.component,
          coalesce((SELECT q.state = 'shutting_down'
                      FROM queriers q
                     WHERE q.querier = wi.querier), false) AS querier_leaving,
          coalesce(wi.next_component, wi.component) AS results_component,
          (SELECT next.aggregate
             FROM job_steps next
            WHERE next.job_id = wi.job_id
              AND next.step_index = wi.step_index + 1) AS next_step_aggregates,
          EXISTS (SELECT 1
                    FROM job_steps agg
                   WHERE agg.job_id = wi.job_id
                     AND agg.aggregate) AS job_aggregates;
