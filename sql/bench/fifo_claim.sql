-- The usual PostgreSQL queue claim: the oldest ready item, no fairness. $1 items at most.
UPDATE work_items
   SET status = 'running', attempt = attempt + 1,
       lease_expires_at = now() + interval '5 minutes', updated_at = now()
 WHERE id IN (
           SELECT id FROM work_items
            WHERE status = 'ready'
            ORDER BY id
            LIMIT $1
              FOR UPDATE SKIP LOCKED
       )
RETURNING id, job_id;
