-- $1 job id, $2 user, $3 is_async, $4 tenant, $5 actor path, $6 priority, $7 traceparent.
INSERT INTO jobs (job_id, username, is_async, tenant, actor, priority, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7);
