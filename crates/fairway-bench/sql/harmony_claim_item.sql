-- Harmony's pick within the chosen job: the lowest ready item, skipping locked ones.
UPDATE work_items
   SET status = 'running', attempt = attempt + 1,
       lease_expires_at = now() + interval '5 minutes', updated_at = now()
 WHERE id = (
           SELECT id FROM work_items
            WHERE job_id = $1 AND step_index = 0 AND status = 'ready'
            ORDER BY id
            LIMIT 1
              FOR UPDATE SKIP LOCKED
       )
RETURNING id, job_id;
