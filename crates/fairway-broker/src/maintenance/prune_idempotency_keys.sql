-- Deletes up to $1 expired Idempotency-Keys, those that expired first (idempotency_keys_expiry),
-- so that one pruning transaction stays short however many expired at once. The rows are
-- deleted by the ctids the locking read found: a join back on the key would let a generic plan
-- hash the whole table.
WITH deleted AS (
    DELETE FROM idempotency_keys
     WHERE ctid = ANY (ARRAY(
               SELECT ctid
                 FROM idempotency_keys
                WHERE expires_at <= now()
                ORDER BY expires_at
                LIMIT $1
                  FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS deleted FROM deleted;
