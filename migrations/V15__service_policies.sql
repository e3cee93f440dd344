-- Service policies: a cap on a service's running items and a rate limit on how fast its items
-- are handed out, over every broker. A service without a row has neither, and its claims never
-- read this table beyond one primary-key probe per batch.
--
-- The rate limit is a token bucket kept as one time (the generic cell rate algorithm): each
-- item handed out moves next_free on by the emission interval, 1 / rate_per_second, and an
-- item is due once next_free is at most (burst − 1) intervals ahead of now. So a limited
-- service costs one row rewritten per claim batch, and an unlimited one nothing.
CREATE TABLE service_policies (
    service         text             PRIMARY KEY,
    max_running     integer          NOT NULL DEFAULT 0 CHECK (max_running >= 0),
    rate_per_second double precision NOT NULL DEFAULT 0 CHECK (rate_per_second >= 0),
    burst           integer          NOT NULL DEFAULT 1 CHECK (burst >= 1),
    next_free       timestamptz,
    updated_at      timestamptz      NOT NULL DEFAULT now()
);
