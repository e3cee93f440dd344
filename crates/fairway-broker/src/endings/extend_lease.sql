-- A heartbeat: extends the lease of the current attempt $2 of running item $1 by $3 ms, when
-- token $4 claimed it ($4 NULL: whoever did); answers when the lease now ends.
UPDATE work_items
   SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
       updated_at = now()
 WHERE id = $1
   AND attempt = $2
   -- Running, spelled so that only the primary key can find the item (see
   -- work_items_running_means_leased).
   AND lease_expires_at IS NOT NULL
   AND ($4::bigint IS NULL OR claimed_by = $4::bigint)
RETURNING lease_expires_at;
