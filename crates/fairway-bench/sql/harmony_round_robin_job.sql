-- Harmony's production query: rank each user's jobs with ready work by last_worked and take
-- the first, interleaving users, synchronous first.
SELECT job_id
  FROM (
      SELECT job_id, is_async, last_worked,
             ROW_NUMBER() OVER (PARTITION BY username ORDER BY last_worked) AS rank
        FROM harmony_user_work
       WHERE service_id = $1 AND ready_count > 0
  ) ranked
 ORDER BY is_async, rank, last_worked
 LIMIT 1;
