-- Takes the row lock of the user who owns job $1 (no row: no such job).
SELECT u.username
  FROM users u
 WHERE u.username = (SELECT j.username FROM jobs j WHERE j.job_id = $1)
   FOR NO KEY UPDATE;
