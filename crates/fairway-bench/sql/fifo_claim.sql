-- The usual PostgreSQL queue claim: the oldest ready item, no fairness. $1 items at most. The
-- ids go through an array so that a plan made once, not knowing $1, still probes the primary
-- key per id instead of hashing the whole table.
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
RETURNING id, job_id;
