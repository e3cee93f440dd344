-- Policies for users and tenants: a weight, a cap on running items and a rate limit, each
-- enforced by the claim in its own transaction (docs/policies.md, docs/design.md).
--
-- The policy lives on the users and tenants rows, which claims already lock. A rate limit is a
-- bucket kept as one time, next_free, as for services (service_policies). A user whose bucket
-- is empty also has throttled_until, the time its next item is due, so that claims can take it
-- out of the fair order until then and put it back with one probe of a small index.
ALTER TABLE users
    ADD COLUMN weight          integer          NOT NULL DEFAULT 1
        CHECK (weight BETWEEN 1 AND 1000),
    ADD COLUMN max_running     integer          NOT NULL DEFAULT 0 CHECK (max_running >= 0),
    ADD COLUMN rate_per_second double precision NOT NULL DEFAULT 0 CHECK (rate_per_second >= 0),
    ADD COLUMN burst           integer          NOT NULL DEFAULT 1 CHECK (burst >= 1),
    ADD COLUMN next_free       timestamptz,
    ADD COLUMN throttled_until timestamptz;

CREATE INDEX users_throttled ON users (throttled_until) WHERE throttled_until IS NOT NULL;

ALTER TABLE tenants
    ADD COLUMN weight          integer          NOT NULL DEFAULT 1
        CHECK (weight BETWEEN 1 AND 1000),
    ADD COLUMN max_running     integer          NOT NULL DEFAULT 0 CHECK (max_running >= 0),
    ADD COLUMN rate_per_second double precision NOT NULL DEFAULT 0 CHECK (rate_per_second >= 0),
    ADD COLUMN burst           integer          NOT NULL DEFAULT 1 CHECK (burst >= 1),
    ADD COLUMN next_free       timestamptz;

-- The user level of the fair order compares running items divided by weight. share is that
-- quotient scaled by a million and truncated: with weights of at most 1000, two users' shares
-- compare exactly as a.running × b.weight against b.running × a.weight would, and a weight of 1
-- leaves the order as running_count alone gave it. The row copies the user's weight, cap and
-- whether its bucket is empty, as it copies its counts, and in_order says whether the user may
-- be served at all: a user at its cap or out of tokens leaves the order's head instead of
-- being stepped over by every claim.
ALTER TABLE service_users
    ADD COLUMN weight      integer NOT NULL DEFAULT 1,
    ADD COLUMN max_running integer NOT NULL DEFAULT 0,
    ADD COLUMN throttled   boolean NOT NULL DEFAULT false,
    ADD COLUMN share       bigint GENERATED ALWAYS AS (running_count::bigint * 1000000 / weight)
        STORED,
    ADD COLUMN in_order    boolean GENERATED ALWAYS AS (
        NOT throttled AND (max_running = 0 OR running_count < max_running)) STORED;

CREATE INDEX service_users_fair_share
    ON service_users (service, component, tenant, in_order, share, last_worked NULLS FIRST,
                      username)
    WHERE ready_count > 0;
DROP INDEX service_users_fair_order;
ALTER INDEX service_users_fair_share RENAME TO service_users_fair_order;

-- The tenant level likewise, with the tenant's weight copied onto each of its queues.
ALTER TABLE tenant_queues
    ADD COLUMN weight integer NOT NULL DEFAULT 1,
    ADD COLUMN share  bigint GENERATED ALWAYS AS (running_count::bigint * 1000000 / weight)
        STORED;

CREATE INDEX tenant_queues_fair_share
    ON tenant_queues (service, component, share, last_worked NULLS FIRST, tenant)
    WHERE active;
DROP INDEX tenant_queues_fair_order;
ALTER INDEX tenant_queues_fair_share RENAME TO tenant_queues_fair_order;
