SELECT job_id, username, is_async, status::text, created_at, updated_at
  FROM jobs
 WHERE job_id = $1;
