SELECT job_id, username, is_async, tenant, actor, status::text, created_at, updated_at
  FROM jobs
 WHERE job_id = $1;
