-- The batched FIFO's endings: every item of one gathered batch in one statement.
UPDATE work_items
   SET status = 'successful', results = '[]', lease_expires_at = NULL, updated_at = now()
 WHERE id = ANY($1);
