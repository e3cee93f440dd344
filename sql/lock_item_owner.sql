-- Takes the row lock of the user who owns work item $1 (no row: no such item).
SELECT u.username
  FROM users u
 WHERE u.username = (
           SELECT j.username
             FROM work_items wi
             JOIN jobs j ON j.job_id = wi.job_id
            WHERE wi.id = $1
       )
   FOR NO KEY UPDATE;
