-- The broker core: jobs, their steps and work items, and the small rows that keep the
-- fair order so that a claim is a few index probes, whatever the backlog.
--
-- Lock order: every transaction that changes a user's work first locks that user's row in
-- `users` (FOR NO KEY UPDATE), then touches that user's jobs, user_work, service_users and
-- work_items rows. Claims lock with SKIP LOCKED, so they never wait on an item.

CREATE TYPE job_status AS ENUM (
    'accepted', 'running', 'paused', 'successful', 'complete_with_errors', 'failed', 'canceled'
);

CREATE TYPE work_item_status AS ENUM ('ready', 'running', 'successful', 'failed', 'canceled');

-- One row per user: work in progress over every service, and when any of the user's work was
-- last handed out (Harmony's steps 2 and 3).
CREATE TABLE users (
    username      text        PRIMARY KEY,
    running_count integer     NOT NULL DEFAULT 0 CHECK (running_count >= 0),
    last_worked   timestamptz
) WITH (fillfactor = 50);

CREATE TABLE jobs (
    job_id     uuid        PRIMARY KEY,
    username   text        NOT NULL REFERENCES users,
    is_async   boolean     NOT NULL,
    status     job_status  NOT NULL DEFAULT 'accepted',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_by_user ON jobs (username);

-- Harmony's user_work table, one row per job step, with every item count of the step kept in
-- the same transaction as the item change that moves it. `paused` takes the step's ready items
-- out of service_users without touching the items.
CREATE TABLE user_work (
    job_id           uuid        NOT NULL REFERENCES jobs,
    step_index       integer     NOT NULL CHECK (step_index >= 0),
    username         text        NOT NULL,
    service          text        NOT NULL,
    is_async         boolean     NOT NULL,
    aggregate        boolean     NOT NULL,
    paused           boolean     NOT NULL DEFAULT false,
    ready_count      integer     NOT NULL DEFAULT 0 CHECK (ready_count >= 0),
    running_count    integer     NOT NULL DEFAULT 0 CHECK (running_count >= 0),
    successful_count integer     NOT NULL DEFAULT 0 CHECK (successful_count >= 0),
    failed_count     integer     NOT NULL DEFAULT 0 CHECK (failed_count >= 0),
    canceled_count   integer     NOT NULL DEFAULT 0 CHECK (canceled_count >= 0),
    last_worked      timestamptz,
    PRIMARY KEY (job_id, step_index)
) WITH (fillfactor = 50);

-- Step 4: within a user, synchronous jobs first, then the job worked least recently.
CREATE INDEX user_work_claimable
    ON user_work (service, username, is_async, last_worked NULLS FIRST, job_id, step_index)
    WHERE ready_count > 0 AND NOT paused;

-- Operators list user_work by user (and service) in this order; LIMIT stops the scan early.
CREATE INDEX user_work_by_user ON user_work (username, service, job_id, step_index);

-- The three small tables above and below are rewritten on every claim and completion; the low
-- fillfactor leaves room on each page for HOT updates, which skip index maintenance.
--
-- One row per (service, user): the user's claimable (ready, not paused) items for the service,
-- with copies of the user's running_count and last_worked so that the fair order of users is
-- one index (steps 1 to 3). The copies are rewritten whenever the users row changes.
CREATE TABLE service_users (
    service       text        NOT NULL,
    username      text        NOT NULL REFERENCES users,
    ready_count   integer     NOT NULL DEFAULT 0 CHECK (ready_count >= 0),
    running_count integer     NOT NULL DEFAULT 0,
    last_worked   timestamptz,
    -- User first: every change to a user's work rewrites all of that user's rows.
    PRIMARY KEY (username, service)
) WITH (fillfactor = 50);

CREATE INDEX service_users_fair_order
    ON service_users (service, running_count, last_worked NULLS FIRST, username)
    WHERE ready_count > 0;

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
    FOREIGN KEY (job_id, step_index) REFERENCES user_work
);

-- Step 4's last part: the lowest ready item of a job step. Partial, so that it holds only the
-- ready backlog (Harmony's missing partial index cost it 7 s per pick at 25 M items).
CREATE INDEX work_items_ready ON work_items (job_id, step_index, id) WHERE status = 'ready';

-- The reaper's probe for expired leases.
CREATE INDEX work_items_leases ON work_items (lease_expires_at) WHERE status = 'running';

-- Cancel and aggregation read a job step's items that are not ready. Excluding ready items
-- keeps the planner from picking the next item through this index with a filter on status,
-- which would step over every finished item of the job.
CREATE INDEX work_items_by_step ON work_items (job_id, step_index, id) WHERE status <> 'ready';
