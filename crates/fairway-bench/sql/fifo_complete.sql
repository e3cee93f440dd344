UPDATE work_items
   SET status = 'successful', results = '[]', lease_expires_at = NULL, updated_at = now()
 WHERE id = $1;
