-- Weighted turns and operator tiers in the fair order (docs/policy-design.md,
-- "Weights at any scale").
--
-- Where users outnumber workers every share ties at 0, and the tie went to the least recently
-- worked: one turn each, whatever the weight. Each row of a weighted level now also carries
-- pass, the virtual time of its next turn (start-time fair queueing: a weight-w turn moves it
-- on by 1,000,000 / w), and fresh, set when its ready count rises from 0 so that a returning
-- row starts at its order's clock and banks no credit for its time away. The order is
-- (tier, share, pass, last_worked, name).
--
-- tier is granted by an operator, 1 to 5, lower first, above share: a producer cannot raise
-- its own work. The rows of the order copy it as they copy the weight.
ALTER TABLE users
    ADD COLUMN tier smallint NOT NULL DEFAULT 3 CHECK (tier BETWEEN 1 AND 5);

ALTER TABLE tenants
    ADD COLUMN tier smallint NOT NULL DEFAULT 3 CHECK (tier BETWEEN 1 AND 5);

ALTER TABLE service_users
    ADD COLUMN tier  smallint NOT NULL DEFAULT 3,
    ADD COLUMN pass  bigint,
    ADD COLUMN fresh boolean  NOT NULL DEFAULT true;

ALTER TABLE tenant_queues
    ADD COLUMN tier  smallint NOT NULL DEFAULT 3,
    ADD COLUMN pass  bigint,
    ADD COLUMN fresh boolean  NOT NULL DEFAULT true;

-- One virtual clock per weighted order: the users of a (service, component, tenant) queue, and
-- (tenant NULL) the tenants of a (service, component). It is the greatest start of any turn
-- taken in that order, written once per claim batch under the service's claim lock.
CREATE TABLE fair_clocks (
    service   text   NOT NULL,
    component text   NOT NULL,
    tenant    text,
    clock     bigint NOT NULL DEFAULT 0,
    UNIQUE NULLS NOT DISTINCT (service, component, tenant)
);

-- The orders' indexes with the new keys. The ones they replace stay for the brokers of the
-- release before, which read them during a rolling upgrade; a later release drops them.
CREATE INDEX service_users_fair_turns
    ON service_users (service, component, tenant, in_order, tier, share, pass NULLS FIRST,
                      last_worked NULLS FIRST, username)
    WHERE ready_count > 0;

CREATE INDEX tenant_queues_fair_turns
    ON tenant_queues (service, component, tier, share, pass NULLS FIRST,
                      last_worked NULLS FIRST, tenant)
    WHERE active;
