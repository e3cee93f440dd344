-- Harmony's documented choice of user (steps 1-3), as its code writes it.
SELECT username, SUM(running_count) AS running, MAX(last_worked) AS last_worked
  FROM harmony_user_work
 WHERE username IN (
           SELECT DISTINCT username FROM harmony_user_work
            WHERE service_id = $1 AND ready_count > 0
       )
 GROUP BY username
 ORDER BY 2, 3
 LIMIT 1;
