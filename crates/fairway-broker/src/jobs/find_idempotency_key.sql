-- The live Idempotency-Key $2 of scope $1: the digest of the body that made it and its answer.
SELECT job_id, request_digest, response
  FROM idempotency_keys
 WHERE scope = $1
   AND key = $2
   AND expires_at > now();
