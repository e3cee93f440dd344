-- Of the jobs whose submission was answered 2xx ($1), those the database does not hold: lost
-- in a failover, had the standby not confirmed their commit.
SELECT acked.job_id
  FROM unnest($1::uuid[]) AS acked(job_id)
 WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = acked.job_id);
