-- How the fault suite's jobs ended: each job status with its number of jobs, including jobs the
-- suite never heard of (a submission whose answer was lost).
SELECT status::text, count(*)
  FROM jobs
 GROUP BY status
 ORDER BY status;
