-- Deletes up to $1 expired Idempotency-Keys, those that expired first (idempotency_keys_expiry),
-- so that one pruning transaction stays short however many expired at once.
WITH expired AS (
    SELECT scope, key
      FROM idempotency_keys
     WHERE expires_at <= now()
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM idempotency_keys k
     USING expired e
     WHERE k.scope = e.scope AND k.key = e.key
    RETURNING 1
)
SELECT count(*) AS deleted FROM deleted;
