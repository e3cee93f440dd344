-- Claims Idempotency-Key $2 in scope $1 for a submission whose body digests to $3, creating job
-- $4 and answered with $5, until $6 milliseconds from now. An expired key is taken over. One
-- row when the key is this submission's; none when a live key exists already. Run first in the
-- submission's transaction: a concurrent submission with the same key waits here, before it
-- holds any other lock, until the first commits (then it finds the key) or rolls back (then it
-- takes the key).
INSERT INTO idempotency_keys AS k (scope, key, request_digest, job_id, response, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (scope, key) DO UPDATE
   SET request_digest = excluded.request_digest,
       job_id = excluded.job_id,
       response = excluded.response,
       created_at = now(),
       expires_at = excluded.expires_at
 WHERE k.expires_at <= now()
RETURNING true AS remembered;
