-- The Idempotency-Key of each submission that created a job, so that a producer that never got
-- its answer can send the same request again and get the same answer instead of a second job.
-- `scope` is whom the key belongs to: `token:<id>` with auth, else `user:<job's user>`, so that
-- two producers' keys never collide. `request_digest` is SHA-256 of the request body's
-- canonical JSON (the same body sent again, whatever its key order or spacing, matches);
-- `response` is the body answered with 201. A key lives until `expires_at` (--idempotency-ttl
-- after it was made), after which the pruner deletes it and the key may be used again.
CREATE TABLE idempotency_keys (
    scope          text        NOT NULL,
    key            text        NOT NULL,
    request_digest bytea       NOT NULL,
    job_id         uuid        NOT NULL,
    response       jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- The pruner's order: the keys that expired first.
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
