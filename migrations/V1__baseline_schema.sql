-- fairway's schema: jobs, their steps and work items, and the small rows that keep the fair
-- order, so that a claim is a few index probes whatever the backlog. Schema only: the server
-- functions that read and write these tables live in sql/functions/, one file each, and are
-- installed after the migrations. docs/design.md explains the fair order and the lock order.

CREATE TYPE job_status AS ENUM (
    'accepted', 'running', 'paused', 'successful', 'complete_with_errors', 'failed', 'canceled'
);

CREATE TYPE work_item_status AS ENUM ('ready', 'running', 'successful', 'failed', 'canceled');

CREATE TYPE querier_state AS ENUM ('active', 'shutting_down');

-- The counter tables below are rewritten on every claim and completion; a low fillfactor leaves
-- room on each page for HOT updates, which skip index maintenance.

-- One row per user: work in progress over every service, and when any of the user's work was
-- last handed out. Every transaction that changes a user's work locks this row first.
CREATE TABLE users (
    username      text        PRIMARY KEY,
    running_count integer     NOT NULL DEFAULT 0 CHECK (running_count >= 0),
    last_worked   timestamptz
) WITH (fillfactor = 50);

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

-- Jobs that name no tenant belong to this one.
INSERT INTO tenants (tenant) VALUES ('default');

CREATE TABLE jobs (
    job_id     uuid        PRIMARY KEY,
    username   text        NOT NULL REFERENCES users,
    is_async   boolean     NOT NULL,
    status     job_status  NOT NULL DEFAULT 'accepted',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    tenant     text        NOT NULL REFERENCES tenants,
    -- Loki's actor path below the user: at most three names (the API enforces it).
    actor      text[]      NOT NULL
);

CREATE INDEX jobs_by_user ON jobs (username);

-- A tenant's unfinished jobs, whose ready items count against max_outstanding at submission.
-- On jobs rather than user_work: job rows change a few times in a job's life, user_work rows
-- on every claim.
CREATE INDEX jobs_unfinished_by_tenant ON jobs (tenant)
    WHERE status IN ('accepted', 'running', 'paused');

-- A job's steps, as submitted.
CREATE TABLE job_steps (
    job_id     uuid    NOT NULL REFERENCES jobs,
    step_index integer NOT NULL CHECK (step_index >= 0),
    service    text    NOT NULL,
    aggregate  boolean NOT NULL,
    PRIMARY KEY (job_id, step_index)
);

-- Harmony's user_work table, one row per job step and component, created with the first item
-- of that component. Every item count of the step is kept in the same transaction as the item
-- change that moves it. `paused` takes the step's ready items out of the fair order without
-- touching the items.
CREATE TABLE user_work (
    job_id           uuid        NOT NULL,
    step_index       integer     NOT NULL,
    username         text        NOT NULL,
    service          text        NOT NULL,
    is_async         boolean     NOT NULL,
    paused           boolean     NOT NULL DEFAULT false,
    ready_count      integer     NOT NULL DEFAULT 0,
    running_count    integer     NOT NULL DEFAULT 0,
    successful_count integer     NOT NULL DEFAULT 0,
    failed_count     integer     NOT NULL DEFAULT 0,
    canceled_count   integer     NOT NULL DEFAULT 0,
    last_worked      timestamptz,
    component        text        NOT NULL,
    tenant           text        NOT NULL,
    actor            text[]      NOT NULL,
    -- A lower bound of the step's ready item ids: a claim starts reading work_items_ready
    -- here rather than over the dead entries of every item the step handed out since
    -- work_items was last vacuumed. Raised by claims; lowered by lower_ready_from when an
    -- item becomes ready again.
    ready_from       bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, step_index, component),
    FOREIGN KEY (job_id, step_index) REFERENCES job_steps,
    -- One expression for every count: each is rebuilt on every update, and these rows are
    -- updated several times per claim.
    CONSTRAINT user_work_not_negative CHECK (
        step_index >= 0
        AND ready_count >= 0
        AND running_count >= 0
        AND successful_count >= 0
        AND failed_count >= 0
        AND canceled_count >= 0
    )
) WITH (fillfactor = 50);

-- Within a user (and actor node): synchronous jobs first, then the job worked least recently.
CREATE INDEX user_work_claimable
    ON user_work (service, component, tenant, username, actor, is_async,
                  last_worked NULLS FIRST, job_id, step_index)
    WHERE ready_count > 0 AND NOT paused;

-- Operators list user_work by user (and service) in this order; LIMIT stops the scan early.
CREATE INDEX user_work_by_user ON user_work (username, service, job_id, step_index, component);

-- One row per (service, component, tenant, user): the user's claimable (ready, not paused)
-- items there, with copies of the user's running_count and last_worked, so that the fair order
-- of users is one index. The copies are rewritten whenever the users row changes. The local_
-- columns count the user's own jobs, those without an actor path, which compete as one group
-- with the user's first-level actors (actor_queues).
CREATE TABLE service_users (
    service           text        NOT NULL,
    username          text        NOT NULL REFERENCES users,
    ready_count       integer     NOT NULL DEFAULT 0,
    running_count     integer     NOT NULL DEFAULT 0,
    last_worked       timestamptz,
    component         text        NOT NULL,
    tenant            text        NOT NULL,
    local_ready       integer     NOT NULL DEFAULT 0,
    local_running     integer     NOT NULL DEFAULT 0,
    local_last_worked timestamptz,
    -- User first: every change to a user's work rewrites all of that user's rows.
    PRIMARY KEY (username, service, component, tenant),
    CONSTRAINT service_users_not_negative CHECK (
        ready_count >= 0 AND local_ready >= 0 AND local_running >= 0
    )
) WITH (fillfactor = 50);

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
    ready_count       integer     NOT NULL DEFAULT 0,
    running_count     integer     NOT NULL DEFAULT 0,
    last_worked       timestamptz,
    -- Jobs whose path is exactly this one.
    local_ready       integer     NOT NULL DEFAULT 0,
    local_running     integer     NOT NULL DEFAULT 0,
    local_last_worked timestamptz,
    PRIMARY KEY (username, service, component, tenant, path),
    CHECK (parent = path[1:cardinality(path) - 1]),
    CONSTRAINT actor_queues_not_negative CHECK (
        ready_count >= 0 AND running_count >= 0 AND local_ready >= 0 AND local_running >= 0
    )
) WITH (fillfactor = 50);

CREATE INDEX actor_queues_fair_order
    ON actor_queues (username, service, component, tenant, parent, running_count,
                     last_worked NULLS FIRST, path)
    WHERE ready_count > 0;

-- The tenant level of the fair order, per (service, component). Its running count is kept
-- exact while two or more tenants compete for a component. A tenant alone in a component needs
-- no order, and there its row would be the one row every claim and completion rewrites, each
-- waiting for the previous commit; so then nobody writes it, and the reaper recounts it from
-- the leases, ready for when a rival arrives (whose never-worked last_worked puts it first on
-- ties). `active` is set, under the row lock, by whoever makes a user's work claimable, and
-- cleared by the reaper under the same lock once nothing is ready: a claim never misses a
-- tenant's work.
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

-- Changes to tenant_queues.running_count not yet applied to the row, logged by endings so that
-- they take no tenant row lock. The row's count plus its rows here is the tenant's running
-- count (while it has rivals). Claim batches fold the log (fold_tenant_running_changes).
CREATE TABLE tenant_running_changes (
    service   text    NOT NULL,
    component text    NOT NULL,
    tenant    text    NOT NULL,
    running   integer NOT NULL
);

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

CREATE TABLE work_items (
    id               bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           uuid             NOT NULL,
    step_index       integer          NOT NULL,
    status           work_item_status NOT NULL DEFAULT 'ready',
    payload          jsonb            NOT NULL DEFAULT 'null',
    inputs           jsonb            NOT NULL DEFAULT '[]',
    results          jsonb,
    error            text,
    attempt          integer          NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lease_expires_at timestamptz,
    querier          text,
    worker           integer,
    created_at       timestamptz      NOT NULL DEFAULT now(),
    updated_at       timestamptz      NOT NULL DEFAULT now(),
    component        text             NOT NULL,
    -- The component a successful item's results go on to (NULL: its own).
    next_component   text,
    FOREIGN KEY (job_id, step_index, component) REFERENCES user_work,
    -- An item is running exactly when it holds a lease. Statements that address one item by
    -- id say "running" as `lease_expires_at IS NOT NULL`: `status = 'running'` would imply
    -- the predicates of the partial indexes below, and the planner, misled by their estimates
    -- right after a bulk load, could read the item through one of them instead of its key.
    CONSTRAINT work_items_running_means_leased
        CHECK ((status = 'running') = (lease_expires_at IS NOT NULL))
);

-- A job step's lowest ready item of a component. Partial, so that it holds only the ready
-- backlog: a pick never steps over finished items.
CREATE INDEX work_items_ready ON work_items (job_id, step_index, component, id)
    WHERE status = 'ready';

-- The reaper's probe for expired leases.
CREATE INDEX work_items_leases ON work_items (lease_expires_at) WHERE status = 'running';

-- Cancel and aggregation read a job step's items that are not ready. Excluding ready items
-- keeps the planner from picking the next item through this index with a filter on status,
-- which would step over every finished item of the job.
CREATE INDEX work_items_by_step ON work_items (job_id, step_index, id) WHERE status <> 'ready';

-- Each tenant queue's running items, counted from the items, which only the leases index
-- needs to find: what the reaper's recount compares the rows with.
CREATE VIEW tenant_queue_running_items AS
SELECT uw.service, uw.component, uw.tenant, count(*)::integer AS running
  FROM work_items wi
  JOIN user_work uw
    ON (uw.job_id, uw.step_index, uw.component) = (wi.job_id, wi.step_index, wi.component)
 WHERE wi.status = 'running'
 GROUP BY uw.service, uw.component, uw.tenant;

-- Which set of sql/functions/ the database holds (src/db/functions.rs): one row, written when
-- a broker installs its set.
CREATE TABLE fairway_functions (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    revision     integer     NOT NULL,
    -- SHA-256 of the files' names and text.
    digest       text        NOT NULL,
    -- The installed functions, as regprocedure spells them: what the next set drops first.
    signatures   text[]      NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
