-- Tenant $1's jobs whose status is one of $2, created before $3, or at $3 with an id below
-- $4: the newest $5. One range of jobs_by_tenant_status per status, each stopped after $5
-- entries, merged.
SELECT j.job_id, j.username, j.is_async, j.tenant, j.actor, j.priority, j.status::text,
       j.created_at, j.updated_at,
       coalesce((SELECT jsonb_object_agg(m.key, m.value)
                   FROM job_metadata m
                  WHERE m.job_id = j.job_id), '{}') AS metadata
  FROM unnest($2::text[]::job_status[]) AS wanted(status)
 CROSS JOIN LATERAL (
       SELECT *
         FROM jobs
        WHERE jobs.tenant = $1
          AND jobs.status = wanted.status
          AND (jobs.created_at, jobs.job_id) < ($3, $4)
        ORDER BY jobs.created_at DESC, jobs.job_id DESC
        LIMIT $5
       ) j
 ORDER BY j.created_at DESC, j.job_id DESC
 LIMIT $5;
