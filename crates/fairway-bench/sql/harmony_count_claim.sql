-- Harmony's step 5 and its counters, in the claim's transaction.
UPDATE harmony_user_work
   SET ready_count = ready_count - 1, running_count = running_count + 1, last_worked = now()
 WHERE job_id = $1 AND service_id = $2;
