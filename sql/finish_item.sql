-- Records the outcome $3 ('successful', 'failed' or 'ready' for a retry) of the current attempt
-- $2 of running item $1. With $6 the update applies only when the lease has expired (the
-- reaper's case). No row: the attempt is stale or the item is not running.
UPDATE work_items
   SET status = $3::text::work_item_status,
       results = $4,
       error = $5,
       lease_expires_at = NULL,
       updated_at = now()
 WHERE id = $1
   AND attempt = $2
   AND status = 'running'
   AND (NOT $6 OR lease_expires_at <= now())
RETURNING job_id, step_index;
