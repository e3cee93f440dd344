-- When any broker's worker last asked for each service's work: what tells an operator that a
-- service with ready work has no worker at all, rather than busy ones. Brokers write it from
-- memory every few seconds, not on every work request.
CREATE TABLE service_asks (
    service    text        PRIMARY KEY,
    last_asked timestamptz NOT NULL
);
