-- $1 job id, $2 user, $3 is_async, $4 tenant, $5 actor path, $6 priority; its retry policy
-- ($7 max attempts, $8 backoff, $9 initial and $10 longest delay in milliseconds; all NULL for
-- none), $11 the time its items were scheduled for (NULL: none) and $12 the producer's
-- traceparent (NULL: none).
INSERT INTO jobs (job_id, username, is_async, tenant, actor, priority, retry_max_attempts,
                  retry_backoff, retry_initial_ms, retry_max_ms, not_before, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);
