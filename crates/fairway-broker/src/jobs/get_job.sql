SELECT j.job_id, j.username, j.is_async, j.tenant, j.actor, j.priority, j.status::text,
       j.retry_max_attempts, j.retry_backoff, j.retry_initial_ms, j.retry_max_ms, j.not_before,
       j.created_at, j.updated_at,
       coalesce((SELECT jsonb_object_agg(m.key, m.value)
                   FROM job_metadata m
                  WHERE m.job_id = j.job_id), '{}') AS metadata
  FROM jobs j
 WHERE j.job_id = $1;
