-- Claim strategies over job metadata (README, "Claim strategies"): a job's priority, its
-- submission order and its strategic metadata, stored relationally, and small tables that
-- hold exactly the claimable job steps in each strategy's order, so that a claim under any
-- strategy reads an index from its head rather than the backlog. Schema only: the trigger
-- functions that keep these tables (track_claimable_step, log_strategy_running) and their
-- bindings live in sql/functions/.

-- Higher goes first under the `priority` strategy; `seq` is the submission order that
-- `oldest` and `newest` read.
ALTER TABLE jobs
    ADD COLUMN priority integer NOT NULL DEFAULT 0
        CHECK (priority BETWEEN -1000000 AND 1000000),
    ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;

-- A job's strategic metadata, one row per key: a string or an integer, as jsonb so that the
-- string "1" and the number 1 stay different values.
CREATE TABLE job_metadata (
    job_id uuid  NOT NULL REFERENCES jobs,
    key    text  NOT NULL CHECK (key ~ '^[a-z0-9_.-]{1,64}$'),
    value  jsonb NOT NULL CHECK (jsonb_typeof(value) IN ('string', 'number')),
    PRIMARY KEY (job_id, key)
);

-- The jobs with a given key and value.
CREATE INDEX job_metadata_by_value ON job_metadata (key, value, job_id);

-- Whether the step's job has metadata: the trigger that counts running items per metadata
-- value fires only for such steps, so jobs without metadata pay nothing for it.
ALTER TABLE user_work ADD COLUMN has_metadata boolean NOT NULL DEFAULT false;

-- The claimable job steps (user_work rows with ready items, not paused), with the order keys
-- of every strategy fixed when the step becomes claimable: the job's submission order and
-- priority, and a hash of the step's key for `random`. Kept by a trigger on user_work that
-- fires only when claimability changes, so the fair claim, which rewrites user_work on every
-- item, pays only when a step runs out of ready items or gets its first.
CREATE TABLE claimable_steps (
    job_id     uuid    NOT NULL,
    step_index integer NOT NULL,
    component  text    NOT NULL,
    service    text    NOT NULL,
    tenant     text    NOT NULL,
    username   text    NOT NULL,
    seq        bigint  NOT NULL,
    priority   integer NOT NULL,
    shuffle    integer NOT NULL,
    PRIMARY KEY (job_id, step_index, component)
);

CREATE INDEX claimable_steps_oldest ON claimable_steps (service, seq);
CREATE INDEX claimable_steps_priority ON claimable_steps (service, priority DESC, seq);
CREATE INDEX claimable_steps_random ON claimable_steps (service, shuffle);

-- The claimable steps again, one row per metadata key of their job, so that `select_only`
-- over oldest, newest, priority or random is one index read from its head.
CREATE TABLE claimable_step_metadata (
    service    text    NOT NULL,
    key        text    NOT NULL,
    value      jsonb   NOT NULL,
    job_id     uuid    NOT NULL,
    step_index integer NOT NULL,
    component  text    NOT NULL,
    seq        bigint  NOT NULL,
    priority   integer NOT NULL,
    shuffle    integer NOT NULL,
    PRIMARY KEY (job_id, step_index, component, key)
);

CREATE INDEX claimable_step_metadata_oldest
    ON claimable_step_metadata (service, key, value, seq);
CREATE INDEX claimable_step_metadata_priority
    ON claimable_step_metadata (service, key, value, priority DESC, seq);
CREATE INDEX claimable_step_metadata_random
    ON claimable_step_metadata (service, key, value, shuffle);

-- Items running per (service, metadata key, value), for prefer_distinct and max_simultaneous.
-- The row's count plus its rows in strategy_running_changes is the exact count. A claim
-- under a cap locks the row (SKIP LOCKED), folds the log into it and reads it before it takes
-- an item, and holds it to commit; so two claims never admit against the same count. Rows
-- are created at submission, never by a claim, so that claims never wait on an insert.
CREATE TABLE strategy_running (
    service text    NOT NULL,
    key     text    NOT NULL,
    value   jsonb   NOT NULL,
    running integer NOT NULL DEFAULT 0,
    PRIMARY KEY (service, key, value)
) WITH (fillfactor = 50);

-- Changes to strategy_running.running not yet folded into the row, logged by every
-- transaction that moves a running count of a step with metadata, without a row lock, so that
-- endings never wait for capped claims.
CREATE TABLE strategy_running_changes (
    service text    NOT NULL,
    key     text    NOT NULL,
    value   jsonb   NOT NULL,
    running integer NOT NULL
);

CREATE INDEX strategy_running_changes_by_value ON strategy_running_changes (service, key, value);

-- Steps already claimable when this migration runs (jobs submitted before it have no
-- metadata, so no claimable_step_metadata rows). The shuffle is the one
-- track_claimable_step computes.
INSERT INTO claimable_steps (job_id, step_index, component, service, tenant, username, seq,
                             priority, shuffle)
SELECT uw.job_id, uw.step_index, uw.component, uw.service, uw.tenant, uw.username, j.seq,
       j.priority, hashtext(uw.job_id::text || '/' || uw.step_index || '/' || uw.component)
  FROM user_work uw
  JOIN jobs j ON j.job_id = uw.job_id
 WHERE uw.ready_count > 0
   AND NOT uw.paused;
