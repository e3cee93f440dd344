-- User $1's jobs (only tenant $2's, unless NULL) or, with $1 NULL, tenant $2's, whose status is
-- one of $3, created before $4, or at $4 with an id below $5, with a step on service $7 (NULL:
-- any): the newest $6. One range per status of jobs_by_user_status (a user's) or
-- jobs_by_tenant_status (a tenant's), each stopped after $6 entries, merged. The service is
-- looked up by job_steps' key for each job a range meets: as IN over a correlated list (not an
-- EXISTS, which the planner may turn into a hash of every job's steps). Only one branch of the
-- UNION reads: the other's filter on $1 is false before it starts.
SELECT j.job_id, j.username, j.is_async, j.tenant, j.actor, j.priority, j.status::text,
       j.retry_max_attempts, j.retry_backoff, j.retry_initial_ms, j.retry_max_ms, j.not_before,
       j.created_at, j.updated_at,
       coalesce((SELECT jsonb_object_agg(m.key, m.value)
                   FROM job_metadata m
                  WHERE m.job_id = j.job_id), '{}') AS metadata
  FROM unnest($3::text[]::job_status[]) AS wanted(status)
 CROSS JOIN LATERAL (
       (SELECT *
          FROM jobs
         WHERE $1::text IS NOT NULL
           AND jobs.username = $1
           AND jobs.status = wanted.status
           AND (jobs.created_at, jobs.job_id) < ($4, $5)
           AND ($2::text IS NULL OR jobs.tenant = $2)
           AND ($7::text IS NULL OR $7 IN (SELECT s.service
                                             FROM job_steps s
                                            WHERE s.job_id = jobs.job_id))
         ORDER BY jobs.created_at DESC, jobs.job_id DESC
         LIMIT $6)
       UNION ALL
       (SELECT *
          FROM jobs
         WHERE $1::text IS NULL
           AND jobs.tenant = $2
           AND jobs.status = wanted.status
           AND (jobs.created_at, jobs.job_id) < ($4, $5)
           AND ($7::text IS NULL OR $7 IN (SELECT s.service
                                             FROM job_steps s
                                            WHERE s.job_id = jobs.job_id))
         ORDER BY jobs.created_at DESC, jobs.job_id DESC
         LIMIT $6)
       ) j
 ORDER BY j.created_at DESC, j.job_id DESC
 LIMIT $6;
