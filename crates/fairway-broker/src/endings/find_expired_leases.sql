-- Up to $1 running items whose lease has expired, oldest first.
SELECT id, attempt
  FROM work_items
 WHERE status = 'running'
   AND lease_expires_at <= now()
 ORDER BY lease_expires_at
 LIMIT $1;
