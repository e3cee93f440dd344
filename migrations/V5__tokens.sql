-- Bearer tokens (README, "Security"). A token is shown once, when it is made; the database
-- keeps only its SHA-256 (`hash`), so that every broker on the database agrees on who may do
-- what and a copy of the database gives no token away. Tokens are never deleted: a revoked
-- token keeps its row, so that its name and last use stay on record, and so that auth, once
-- on (any row here), stays on.
CREATE TABLE tokens (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    role         text        NOT NULL CHECK (role IN ('admin', 'reader', 'producer', 'worker')),
    -- The tenants a producer token may touch, the services a worker token may claim; NULL:
    -- every one. Only those roles are scoped.
    tenants      text[]      CHECK (tenants IS NULL OR (role = 'producer' AND cardinality(tenants) > 0)),
    services     text[]      CHECK (services IS NULL OR (role = 'worker' AND cardinality(services) > 0)),
    -- SHA-256 of the token: the only trace of the secret.
    hash         bytea       NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    -- Moved at most once a minute per token and broker, off the request's path.
    last_used_at timestamptz
);

-- A name names one live token, so that `fairway admin tokens revoke NAME` is unambiguous; a
-- revoked token's name may be used again.
CREATE UNIQUE INDEX tokens_live_name ON tokens (name) WHERE revoked_at IS NULL;

-- The token whose claim holds an item's current lease (tokens.id; NULL: claimed without a
-- token, while auth was off). A worker token may report only on the items it claimed itself,
-- to any broker. No foreign key: tokens are never deleted, and the claim should not pay for
-- the check.
ALTER TABLE work_items ADD COLUMN claimed_by bigint;
