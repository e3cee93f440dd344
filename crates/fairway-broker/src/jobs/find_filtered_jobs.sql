-- The next $8 jobs, in id order after $7, that match a bulk action's filter: user $1, tenant
-- $2, status $3, a step on service $4, created before $5 (each NULL: any), and one of tenants
-- $6 (NULL: any; a producer token's scope). Keyset paging by id, so that a job whose status
-- the action changes is neither met twice nor skipped.
SELECT j.job_id, j.status::text AS status
  FROM jobs j
 WHERE j.job_id > $7
   AND ($1::text IS NULL OR j.username = $1)
   AND ($2::text IS NULL OR j.tenant = $2)
   AND ($3::text IS NULL OR j.status = $3::job_status)
   AND ($4::text IS NULL OR EXISTS (SELECT 1
                                      FROM job_steps s
                                     WHERE s.job_id = j.job_id
                                       AND s.service = $4))
   AND ($5::timestamptz IS NULL OR j.created_at < $5)
   AND ($6::text[] IS NULL OR j.tenant = ANY($6))
 ORDER BY j.job_id
 LIMIT $8;
