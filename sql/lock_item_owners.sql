-- Locks the users rows of the owners of items $1, in username order: a batch of attempt endings
-- takes every users row it needs before it changes anything, so that it never holds one while
-- waiting for another out of order (claims never wait for users rows; they skip held ones).
SELECT u.username
  FROM users u
 WHERE u.username IN (
           SELECT j.username
             FROM work_items wi
             JOIN jobs j ON j.job_id = wi.job_id
            WHERE wi.id = ANY($1)
       )
 ORDER BY u.username
   FOR NO KEY UPDATE;
