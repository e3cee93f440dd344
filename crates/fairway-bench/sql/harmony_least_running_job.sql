-- Harmony's step 4: the user's job for the service, synchronous first, least recently worked.
SELECT job_id
  FROM harmony_user_work
 WHERE username = $1 AND service_id = $2 AND ready_count > 0
 ORDER BY is_async, last_worked
 LIMIT 1;
