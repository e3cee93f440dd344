-- Multi-tenant partitioning. Work is split by query component (per item) and tenant (per job);
-- a claim picks a component, then a tenant sharded to the asking querier, then Harmony's order
-- within the tenant. Queriers and their tenant shards live here, so every broker agrees.
--
-- Lock order, extended: a user's row first (as in V1), then tenant_queues rows, then tenants.

CREATE TABLE tenants (
    tenant          text        PRIMARY KEY,
    -- How many queriers serve the tenant; 0, or more than there are, means all of them.
    max_queriers    integer     NOT NULL DEFAULT 0 CHECK (max_queriers >= 0),
    -- Most ready items the tenant may have waiting; 0 means no limit.
    max_outstanding integer     NOT NULL DEFAULT 0 CHECK (max_outstanding >= 0),
    -- Whether only the queriers in tenant_shards serve it. Kept by the shard recomputation,
    -- so that a claim reads a flag instead of counting members.
    sharded         boolean     NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

INSERT INTO tenants (tenant) VALUES ('default');

ALTER TABLE jobs
    ADD COLUMN tenant text NOT NULL DEFAULT 'default' REFERENCES tenants,
    ADD COLUMN actor text[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ALTER COLUMN tenant DROP DEFAULT, ALTER COLUMN actor DROP DEFAULT;

-- A job's steps. user_work now has a row per step and component, created with the first item
-- of that component, so the step's own definition lives here.
CREATE TABLE job_steps (
    job_id     uuid    NOT NULL REFERENCES jobs,
    step_index integer NOT NULL CHECK (step_index >= 0),
    service    text    NOT NULL,
    aggregate  boolean NOT NULL,
    PRIMARY KEY (job_id, step_index)
);

INSERT INTO job_steps (job_id, step_index, service, aggregate)
SELECT job_id, step_index, service, aggregate FROM user_work;

-- `next_component` is the component a successful item's results go on to (NULL: its own).
ALTER TABLE work_items
    DROP CONSTRAINT work_items_job_id_step_index_fkey,
    ADD COLUMN component text NOT NULL DEFAULT 'unknown',
    ADD COLUMN next_component text;
ALTER TABLE work_items ALTER COLUMN component DROP DEFAULT;

ALTER TABLE user_work
    DROP CONSTRAINT user_work_pkey,
    DROP CONSTRAINT user_work_job_id_fkey,
    DROP COLUMN aggregate,
    ADD COLUMN component text NOT NULL DEFAULT 'unknown',
    ADD COLUMN tenant text NOT NULL DEFAULT 'default',
    ADD COLUMN actor text[] NOT NULL DEFAULT '{}';
ALTER TABLE user_work
    ALTER COLUMN component DROP DEFAULT,
    ALTER COLUMN tenant DROP DEFAULT,
    ALTER COLUMN actor DROP DEFAULT;

-- V1 made a row per step at submission; rows now come with their first item.
DELETE FROM user_work
 WHERE ready_count + running_count + successful_count + failed_count + canceled_count = 0;

ALTER TABLE user_work
    ADD PRIMARY KEY (job_id, step_index, component),
    ADD FOREIGN KEY (job_id, step_index) REFERENCES job_steps;
ALTER TABLE work_items
    ADD FOREIGN KEY (job_id, step_index, component) REFERENCES user_work;

DROP INDEX user_work_claimable;
CREATE INDEX user_work_claimable
    ON user_work (service, component, tenant, username, actor, is_async,
                  last_worked NULLS FIRST, job_id, step_index)
    WHERE ready_count > 0 AND NOT paused;

DROP INDEX user_work_by_user;
CREATE INDEX user_work_by_user ON user_work (username, service, job_id, step_index, component);

-- A tenant's waiting items, for max_outstanding at submission.
CREATE INDEX user_work_outstanding ON user_work (tenant) WHERE ready_count > 0;

DROP INDEX work_items_ready;
CREATE INDEX work_items_ready ON work_items (job_id, step_index, component, id)
    WHERE status = 'ready';

-- Which leases a querier holds: it leaves its shards, or is forgotten, only when none.
CREATE INDEX work_items_held ON work_items (querier) WHERE status = 'running';

-- service_users is now one row per (service, component, tenant, user). The local_ columns
-- count the user's own jobs, those without an actor path, which compete as one group with the
-- user's first-level actors (actor_queues).
ALTER TABLE service_users
    DROP CONSTRAINT service_users_pkey,
    ADD COLUMN component text NOT NULL DEFAULT 'unknown',
    ADD COLUMN tenant text NOT NULL DEFAULT 'default',
    ADD COLUMN local_ready integer NOT NULL DEFAULT 0 CHECK (local_ready >= 0),
    ADD COLUMN local_running integer NOT NULL DEFAULT 0 CHECK (local_running >= 0),
    ADD COLUMN local_last_worked timestamptz;
UPDATE service_users su
   SET local_ready = su.ready_count,
       local_running = coalesce(own.running, 0),
       local_last_worked = own.last_worked
  FROM (SELECT username, service, sum(running_count)::integer AS running,
               max(last_worked) AS last_worked
          FROM user_work
         GROUP BY username, service) own
 WHERE (own.username, own.service) = (su.username, su.service);
ALTER TABLE service_users
    ALTER COLUMN component DROP DEFAULT,
    ALTER COLUMN tenant DROP DEFAULT,
    ADD PRIMARY KEY (username, service, component, tenant);

DROP INDEX service_users_fair_order;
CREATE INDEX service_users_fair_order
    ON service_users (service, component, tenant, running_count, last_worked NULLS FIRST,
                      username)
    WHERE ready_count > 0;

-- Loki's actor tree below a user, one row per (service, component, tenant, user, actor path
-- prefix). A node's children (the actors one level down) compete with its own jobs, those whose
-- path ends at the node (local_ columns), by work in progress, then least recently worked.
-- Only jobs with an actor path have rows here, so a user without actors pays nothing for them.
-- Rows are written only by transactions that hold the user's users row: exact, never contended.
CREATE TABLE actor_queues (
    service           text        NOT NULL,
    component         text        NOT NULL,
    tenant            text        NOT NULL,
    username          text        NOT NULL REFERENCES users,
    path              text[]      NOT NULL CHECK (cardinality(path) BETWEEN 1 AND 3),
    parent            text[]      NOT NULL,
    -- The whole subtree: claimable items, work in progress, last handed out.
    ready_count       integer     NOT NULL DEFAULT 0 CHECK (ready_count >= 0),
    running_count     integer     NOT NULL DEFAULT 0 CHECK (running_count >= 0),
    last_worked       timestamptz,
    -- Jobs whose path is exactly this one.
    local_ready       integer     NOT NULL DEFAULT 0 CHECK (local_ready >= 0),
    local_running     integer     NOT NULL DEFAULT 0 CHECK (local_running >= 0),
    local_last_worked timestamptz,
    PRIMARY KEY (username, service, component, tenant, path),
    CHECK (parent = path[1:cardinality(path) - 1])
) WITH (fillfactor = 50);

CREATE INDEX actor_queues_fair_order
    ON actor_queues (username, service, component, tenant, parent, running_count,
                     last_worked NULLS FIRST, path)
    WHERE ready_count > 0;

-- The tenant level of the fair order, per (service, component). Unlike the user level, its
-- counts are a scheduling hint, not a ledger: with one tenant every claim and completion would
-- otherwise rewrite one row and queue behind each other's commits (measured: a third of the
-- throughput). Claims and completions update it when no other transaction holds it (SKIP
-- LOCKED), which is exact for serial claims; the reaper recounts running_count from the leases.
-- `active` is set, under the row lock, by whoever makes a user's work claimable, and cleared by
-- the reaper under the same lock once nothing is ready: a claim never misses a tenant's work.
CREATE TABLE tenant_queues (
    service       text        NOT NULL,
    component     text        NOT NULL,
    tenant        text        NOT NULL REFERENCES tenants,
    active        boolean     NOT NULL DEFAULT true,
    running_count integer     NOT NULL DEFAULT 0,
    last_worked   timestamptz,
    PRIMARY KEY (service, component, tenant)
) WITH (fillfactor = 50);

CREATE INDEX tenant_queues_fair_order
    ON tenant_queues (service, component, running_count, last_worked NULLS FIRST, tenant)
    WHERE active;

INSERT INTO tenant_queues (service, component, tenant)
SELECT DISTINCT service, component, tenant FROM service_users WHERE ready_count > 0;

CREATE TYPE querier_state AS ENUM ('active', 'shutting_down');

-- Worker pods that asked for work. A querier joins with its first request and leaves on
-- shutdown (once it holds no lease) or after --querier-forget-delay of silence.
CREATE TABLE queriers (
    querier   text          PRIMARY KEY,
    state     querier_state NOT NULL DEFAULT 'active',
    -- Whether shards are drawn from it: until it has shut down and holds no lease.
    in_shards boolean       NOT NULL DEFAULT true,
    joined_at timestamptz   NOT NULL DEFAULT now(),
    last_seen timestamptz   NOT NULL DEFAULT now()
);

-- The queriers serving each sharded tenant, chosen by rendezvous hashing of (tenant, querier).
CREATE TABLE tenant_shards (
    tenant  text NOT NULL REFERENCES tenants ON DELETE CASCADE,
    querier text NOT NULL REFERENCES queriers ON DELETE CASCADE,
    PRIMARY KEY (tenant, querier)
);

CREATE INDEX tenant_shards_by_querier ON tenant_shards (querier);
