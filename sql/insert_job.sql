-- $1 job id, $2 user, $3 is_async.
INSERT INTO jobs (job_id, username, is_async) VALUES ($1, $2, $3);
