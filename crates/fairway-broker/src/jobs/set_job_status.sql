-- $1 job id, $2 the new status.
UPDATE jobs SET status = $2::text::job_status, updated_at = now() WHERE job_id = $1;
