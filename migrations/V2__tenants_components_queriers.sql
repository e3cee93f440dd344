-- Multi-tenant partitioning. Work is split by query component (per item) and tenant (per job);
-- a claim picks a component, then a tenant sharded to the asking querier, then Harmony's order
-- within the tenant. Queriers and their tenant shards live here, so every broker agrees.
--
-- Lock order, extended: a user's row first (as in V1), then the tenants row (submissions for a
-- limited tenant), then tenant_queues rows, last in the transaction and in key order
-- (apply_tenant_deltas): so no two transactions can wait for each other's rows.

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

-- A tenant's unfinished jobs, whose ready items count against max_outstanding at submission.
-- On jobs rather than user_work: job rows change a few times in a job's life, user_work rows
-- on every claim.
CREATE INDEX jobs_unfinished_by_tenant ON jobs (tenant)
    WHERE status IN ('accepted', 'running', 'paused');

DROP INDEX work_items_ready;
CREATE INDEX work_items_ready ON work_items (job_id, step_index, component, id)
    WHERE status = 'ready';

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

-- The tenant level of the fair order, per (service, component). Its counts are kept, exactly,
-- while two or more tenants compete for a component: claims and completions then wait for the
-- row. A tenant alone in a component needs no order, and there its row would be the one row
-- every claim and completion rewrites, each waiting for the previous commit (measured: a third
-- of the throughput). So then nobody writes it, and the reaper recounts running_count from the
-- leases, ready for when a rival arrives (whose never-worked last_worked puts it first on ties).
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

-- Whether another tenant has an active queue in the same component: then the tenant's row is
-- kept exact.
CREATE FUNCTION tenant_has_rivals(p_service text, p_component text, p_tenant text)
RETURNS boolean
LANGUAGE sql
STABLE
AS $rivals$
    -- A scalar subquery ordered like the primary key (EXISTS would drop the order), so that
    -- it is read from that index and stops at the first rival.
    SELECT (SELECT true
              FROM tenant_queues tq
             WHERE tq.service = p_service
               AND tq.component = p_component
               AND tq.tenant <> p_tenant
               AND tq.active
             ORDER BY tq.service, tq.component, tq.tenant
             LIMIT 1) IS NOT NULL;
$rivals$;

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

-- The claim: hands out the next work item of service p_service to worker slot p_worker of
-- querier p_querier, leased for p_lease_ms milliseconds. A function rather than one statement
-- because the choice is a search with early exits (components in turn, tenants, users, actor
-- levels): each step is a small statement that runs only when the step before it needs it, and
-- the whole claim is still one transaction, one round trip.
--
-- The result, always one row:
-- - querier_state NULL: the querier is not a member yet; nothing was claimed (the broker has it
--   join, then asks again). 'shutting_down': nothing was claimed, nor will be.
-- - username NULL: nothing claimable for this querier is free (none exists, or every user with
--   it is held by another transaction; the broker tells which and waits without holding a
--   connection).
-- - stale: the chosen user was served since the order was read, so nothing was claimed and the
--   broker looks again at once. id NULL otherwise: the user's item went to another claim or a
--   cancel in between; the broker looks again too.
-- - Otherwise the claimed item.
--
-- The order:
-- 1. Component: those with claimable work for the service (an active tenant queue; the reaper
--    retires emptied ones within a pass), in name order, visited from the worker's slot modulo
--    their number, wrapping, until one yields a user.
-- 2. Tenant, within the component: active tenant_queues rows by work in progress, then least
--    recently worked, leaving out tenants sharded to other queriers.
-- 3. User, within the tenant: the first in service_users_fair_order (least work in progress
--    over all services, then least recently worked) whose users row is free. SKIP LOCKED sends
--    a concurrent claimer on to the next user, tenant or component instead of queueing.
-- 4. Down the user's actor tree: a node's best child actor goes before the node's own jobs when
--    it has less work in progress, or as much and was worked less recently (never worked counts
--    as longest ago).
-- 5. The node's best job step (synchronous first, then least recently worked), then the step's
--    lowest ready item of the component.
-- 6. The item is leased, and user_work, users, service_users and actor_queues are brought up to
--    date in this same transaction, so the counters never drift; the tenant's hint too, unless
--    another claim holds it.
-- Lock order: the user's users row, the item, then the counter rows (as everywhere), the
-- tenant's row last.
CREATE FUNCTION claim_next_item(
    p_service text,
    p_querier text,
    p_worker integer,
    p_lease_ms bigint,
    -- An active querier's last_seen moves at most once per this many milliseconds.
    p_touch_ms bigint,
    -- Whether the claim may wait for its tenant's row: only when the transaction holds no other
    -- tenant_queues row (the first claim of a batch), so that waits cannot form a cycle.
    p_may_wait boolean,
    OUT querier_state text,
    OUT stale boolean,
    OUT username text,
    OUT id bigint,
    OUT job_id uuid,
    OUT step_index integer,
    OUT component text,
    OUT payload jsonb,
    OUT inputs jsonb,
    OUT attempt integer,
    OUT lease_expires_at timestamptz,
    OUT tenant text,
    OUT actor text[]
)
LANGUAGE plpgsql
AS $claim$
#variable_conflict use_column
DECLARE
    v_components text[];
    v_count integer;
    v_component text;
    v_tenant text;
    v_user text;
    v_stale boolean;
    v_path text[] := '{}';
    v_own record;
    v_child record;
    v_job uuid;
    v_step integer;
    v_at timestamptz;
    v_counted boolean;
BEGIN
    stale := false;
    SELECT q.state::text INTO querier_state FROM queriers q WHERE q.querier = p_querier;
    IF querier_state IS DISTINCT FROM 'active' THEN
        RETURN;
    END IF;
    -- The row is shared by all of the querier's workers: one of them moves it, the rest skip.
    PERFORM 1
       FROM queriers q
      WHERE q.querier = p_querier
        AND q.last_seen < now() - p_touch_ms * interval '1 millisecond'
        FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE queriers q SET last_seen = now() WHERE q.querier = p_querier;
    END IF;

    -- 1. A skip scan over tenant_queues, one probe per component.
    WITH RECURSIVE components AS (
        (SELECT tq.component
           FROM tenant_queues tq
          WHERE tq.service = p_service
            AND tq.active
          ORDER BY tq.component
          LIMIT 1)
        UNION ALL
        SELECT (SELECT tq.component
                  FROM tenant_queues tq
                 WHERE tq.service = p_service
                   AND tq.active
                   AND tq.component > c.component
                 ORDER BY tq.component
                 LIMIT 1)
          FROM components c
         WHERE c.component IS NOT NULL
    )
    SELECT array_agg(c.component ORDER BY c.component)
      INTO v_components
      FROM components c
     WHERE c.component IS NOT NULL;
    v_count := coalesce(cardinality(v_components), 0);

    -- 2 and 3. The order comes from the snapshot; the users row is the latest version once
    -- locked. Its copies in service_users differ exactly when a claim or completion for this
    -- user committed after the snapshot: then the user's place in the order is out of date,
    -- and serving it now could give it two turns in a row (`stale`).
    FOR turn IN 0 .. v_count - 1 LOOP
        v_component := v_components[1 + (p_worker + turn) % v_count];
        SELECT best.username, tq.tenant, best.stale
          INTO v_user, v_tenant, v_stale
          FROM tenant_queues tq
          JOIN tenants t ON t.tenant = tq.tenant
         CROSS JOIN LATERAL (
               SELECT u.username,
                      u.running_count IS DISTINCT FROM su.running_count
                          OR u.last_worked IS DISTINCT FROM su.last_worked AS stale
                 FROM service_users su
                 JOIN users u ON u.username = su.username
                WHERE su.service = p_service
                  AND su.component = tq.component
                  AND su.tenant = tq.tenant
                  AND su.ready_count > 0
                ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
                LIMIT 1
                  FOR NO KEY UPDATE OF u SKIP LOCKED
               ) best
         WHERE tq.service = p_service
           AND tq.component = v_component
           AND tq.active
           -- A scalar subquery, not EXISTS: it stays a primary-key probe per tenant.
           AND (NOT t.sharded
                OR (SELECT true
                      FROM tenant_shards ts
                     WHERE ts.tenant = tq.tenant
                       AND ts.querier = p_querier))
         ORDER BY tq.running_count, tq.last_worked NULLS FIRST, tq.tenant
         LIMIT 1;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_user IS NULL THEN
        RETURN;
    END IF;
    username := v_user;
    IF v_stale THEN
        stale := true;
        RETURN;
    END IF;

    -- 4. The user's own jobs are the root's local group.
    SELECT su.local_ready, su.local_running, su.local_last_worked
      INTO v_own
      FROM service_users su
     WHERE (su.username, su.service, su.component, su.tenant)
           = (v_user, p_service, v_component, v_tenant);
    LOOP
        SELECT a.path, a.running_count, a.last_worked
          INTO v_child
          FROM actor_queues a
         WHERE (a.username, a.service, a.component, a.tenant, a.parent)
               = (v_user, p_service, v_component, v_tenant, v_path)
           AND a.ready_count > 0
         ORDER BY a.running_count, a.last_worked NULLS FIRST, a.path
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        EXIT WHEN v_own.local_ready > 0
              AND (v_child.running_count, coalesce(v_child.last_worked, '-infinity'))
                  >= (v_own.local_running, coalesce(v_own.local_last_worked, '-infinity'));
        v_path := v_child.path;
        SELECT a.local_ready, a.local_running, a.local_last_worked
          INTO v_own
          FROM actor_queues a
         WHERE (a.username, a.service, a.component, a.tenant, a.path)
               = (v_user, p_service, v_component, v_tenant, v_path);
    END LOOP;

    -- 5. The index's leading columns are all bound, so it yields job steps already in order.
    SELECT uw.job_id, uw.step_index
      INTO v_job, v_step
      FROM user_work uw
     WHERE uw.service = p_service
       AND uw.component = v_component
       AND uw.tenant = v_tenant
       AND uw.username = v_user
       AND uw.actor = v_path
       AND uw.ready_count > 0
       AND NOT uw.paused
     ORDER BY uw.is_async, uw.last_worked NULLS FIRST, uw.job_id, uw.step_index
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    UPDATE work_items wi
       SET status = 'running',
           attempt = wi.attempt + 1,
           lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
           querier = p_querier,
           worker = p_worker,
           updated_at = now()
     WHERE wi.id = (SELECT ready.id
                      FROM work_items ready
                     WHERE ready.job_id = v_job
                       AND ready.step_index = v_step
                       AND ready.component = v_component
                       AND ready.status = 'ready'
                     ORDER BY ready.id
                     LIMIT 1
                       FOR NO KEY UPDATE SKIP LOCKED)
 RETURNING wi.id, wi.payload, wi.inputs, wi.attempt, wi.lease_expires_at
      INTO id, payload, inputs, attempt, lease_expires_at;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- 6. One instant for every row this claim touches, so users.last_worked equals the newest
    -- user_work.last_worked (the consistency check relies on it).
    v_at := clock_timestamp();
    UPDATE user_work uw
       SET ready_count = uw.ready_count - 1,
           running_count = uw.running_count + 1,
           last_worked = v_at
     WHERE (uw.job_id, uw.step_index, uw.component) = (v_job, v_step, v_component);
    -- Every row of the user takes the new copies; the claimed queue's row also its counts, and
    -- its own-jobs counts when the job has no actor path.
    WITH user_counts AS (
        UPDATE users u
           SET running_count = u.running_count + 1,
               last_worked = v_at
         WHERE u.username = v_user
     RETURNING u.running_count
    )
    UPDATE service_users su
       SET running_count = uc.running_count,
           last_worked = v_at,
           ready_count = su.ready_count
               - CASE WHEN (su.service, su.component, su.tenant)
                           = (p_service, v_component, v_tenant)
                      THEN 1 ELSE 0 END,
           local_ready = su.local_ready
               - CASE WHEN (su.service, su.component, su.tenant)
                           = (p_service, v_component, v_tenant)
                       AND v_path = '{}'
                      THEN 1 ELSE 0 END,
           local_running = su.local_running
               + CASE WHEN (su.service, su.component, su.tenant)
                           = (p_service, v_component, v_tenant)
                       AND v_path = '{}'
                      THEN 1 ELSE 0 END,
           local_last_worked = CASE WHEN (su.service, su.component, su.tenant)
                                         = (p_service, v_component, v_tenant)
                                     AND v_path = '{}'
                                    THEN v_at ELSE su.local_last_worked END
      FROM user_counts uc
     WHERE su.username = v_user;
    IF v_path <> '{}' THEN
        UPDATE actor_queues a
           SET ready_count = a.ready_count - 1,
               running_count = a.running_count + 1,
               last_worked = v_at,
               local_ready = a.local_ready - CASE WHEN a.path = v_path THEN 1 ELSE 0 END,
               local_running = a.local_running + CASE WHEN a.path = v_path THEN 1 ELSE 0 END,
               local_last_worked = CASE WHEN a.path = v_path THEN v_at
                                        ELSE a.local_last_worked END
         WHERE (a.username, a.service, a.component, a.tenant)
               = (v_user, p_service, v_component, v_tenant)
           AND (a.path = v_path[1:1] OR a.path = v_path[1:2] OR a.path = v_path[1:3]);
    END IF;
    -- The tenant's row, kept while other tenants compete for the component: waited for, or
    -- skipped if held when this claim may not wait (see tenant_queues). A tenant alone there
    -- needs no order, and the reaper recounts its row.
    v_counted := tenant_has_rivals(p_service, v_component, v_tenant);
    IF v_counted AND NOT p_may_wait THEN
        PERFORM 1
           FROM tenant_queues tq
          WHERE (tq.service, tq.component, tq.tenant) = (p_service, v_component, v_tenant)
            FOR NO KEY UPDATE SKIP LOCKED;
        v_counted := FOUND;
    END IF;
    IF v_counted THEN
        UPDATE tenant_queues tq
           SET running_count = tq.running_count + 1,
               last_worked = v_at
         WHERE (tq.service, tq.component, tq.tenant) = (p_service, v_component, v_tenant);
    END IF;
    UPDATE jobs j
       SET status = 'running', updated_at = now()
     WHERE j.job_id = v_job
       AND j.status = 'accepted';

    job_id := v_job;
    step_index := v_step;
    component := v_component;
    tenant := v_tenant;
    actor := v_path;
END;
$claim$;

-- Moves the item counts of job p_job's step p_step, component p_component, by the deltas
-- p_ready, p_running, p_successful, p_failed, p_canceled, and keeps the user's users,
-- service_users and actor_queues rows in step, in the transaction that moved the items. The
-- caller holds the user's users row, and has created the rows (create_step_queues.sql).
-- Returns the step's service (NULL: no such step) and tenant; whether the user's claimable work
-- for it went from none to some (only then can a worker of the service be waiting, so only then
-- is a notification worth its commit-time lock, and must the tenant's queue be active); and how
-- many items of the job are still ready or running. The tenant_queues row is left to
-- apply_tenant_deltas at the end of the caller's transaction, unless p_tenant_now. A function for the same reason as the claim: only the rows a change touches are
-- visited.
CREATE FUNCTION apply_step_deltas(
    p_job uuid,
    p_step integer,
    p_component text,
    p_ready integer,
    p_running integer,
    p_successful integer,
    p_failed integer,
    p_canceled integer,
    -- Whether this is the transaction's only step change: then the tenant's row is brought up
    -- to date here, saving the round trip of apply_tenant_deltas.
    p_tenant_now boolean,
    OUT service text,
    OUT tenant text,
    OUT became_claimable boolean,
    OUT job_open_items integer
)
LANGUAGE plpgsql
AS $deltas$
#variable_conflict use_column
DECLARE
    v_step record;
    -- Paused steps' ready items are not claimable.
    v_claimable integer;
    v_running integer;
    v_queue_ready integer;
BEGIN
    UPDATE user_work uw
       SET ready_count = uw.ready_count + p_ready,
           running_count = uw.running_count + p_running,
           successful_count = uw.successful_count + p_successful,
           failed_count = uw.failed_count + p_failed,
           canceled_count = uw.canceled_count + p_canceled
     WHERE (uw.job_id, uw.step_index, uw.component) = (p_job, p_step, p_component)
 RETURNING uw.username, uw.service, uw.tenant, uw.actor, uw.paused
      INTO v_step;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    service := v_step.service;
    v_claimable := CASE WHEN v_step.paused THEN 0 ELSE p_ready END;

    IF p_running <> 0 THEN
        UPDATE users u
           SET running_count = u.running_count + p_running
         WHERE u.username = v_step.username
     RETURNING u.running_count INTO v_running;
        -- The user's other queue rows keep their copy of its work in progress.
        UPDATE service_users su
           SET running_count = v_running
         WHERE su.username = v_step.username
           AND (su.service, su.component, su.tenant)
               <> (v_step.service, p_component, v_step.tenant);
    END IF;
    UPDATE service_users su
       SET running_count = coalesce(v_running, su.running_count),
           ready_count = su.ready_count + v_claimable,
           local_ready = su.local_ready
               + CASE WHEN v_step.actor = '{}' THEN v_claimable ELSE 0 END,
           local_running = su.local_running
               + CASE WHEN v_step.actor = '{}' THEN p_running ELSE 0 END
     WHERE (su.username, su.service, su.component, su.tenant)
           = (v_step.username, v_step.service, p_component, v_step.tenant)
 RETURNING su.ready_count INTO v_queue_ready;
    IF v_step.actor <> '{}' AND (v_claimable <> 0 OR p_running <> 0) THEN
        UPDATE actor_queues a
           SET ready_count = a.ready_count + v_claimable,
               running_count = a.running_count + p_running,
               local_ready = a.local_ready
                   + CASE WHEN a.path = v_step.actor THEN v_claimable ELSE 0 END,
               local_running = a.local_running
                   + CASE WHEN a.path = v_step.actor THEN p_running ELSE 0 END
         WHERE (a.username, a.service, a.component, a.tenant)
               = (v_step.username, v_step.service, p_component, v_step.tenant)
           AND (a.path = v_step.actor[1:1]
                OR a.path = v_step.actor[1:2]
                OR a.path = v_step.actor[1:3]);
    END IF;

    became_claimable := v_claimable > 0 AND v_queue_ready <= v_claimable;
    tenant := v_step.tenant;
    -- (The rivals check first: most completions are of a tenant alone in its component.)
    IF p_tenant_now
       AND (became_claimable
            OR (p_running <> 0 AND tenant_has_rivals(v_step.service, p_component, v_step.tenant)))
    THEN
        PERFORM apply_tenant_delta(v_step.service, p_component, v_step.tenant, p_running,
                                   became_claimable);
    END IF;

    SELECT coalesce(sum(uw.ready_count + uw.running_count), 0)::integer
      INTO job_open_items
      FROM user_work uw
     WHERE uw.job_id = p_job;
END;
$deltas$;

-- One tenant_queues change: running_count moves by p_running; with p_activate the queue is
-- (re)activated, under the row lock, because a user's work there became claimable (the reaper
-- cannot then retire it meanwhile). The running count is kept while other tenants compete for
-- the component (see tenant_queues).
CREATE FUNCTION apply_tenant_delta(
    p_service text,
    p_component text,
    p_tenant text,
    p_running integer,
    p_activate boolean
)
RETURNS void
LANGUAGE plpgsql
AS $tenant$
BEGIN
    IF p_activate THEN
        INSERT INTO tenant_queues AS tq (service, component, tenant, running_count)
        VALUES (p_service, p_component, p_tenant, greatest(p_running, 0))
            ON CONFLICT (service, component, tenant) DO UPDATE
           SET active = true,
               running_count = greatest(tq.running_count + p_running, 0);
        RETURN;
    END IF;
    -- Kept while other tenants compete for the component; a tenant alone there needs no
    -- order, and the reaper recounts its row.
    IF p_running <> 0 AND tenant_has_rivals(p_service, p_component, p_tenant) THEN
        UPDATE tenant_queues tq
           SET running_count = greatest(tq.running_count + p_running, 0)
         WHERE (tq.service, tq.component, tq.tenant) = (p_service, p_component, p_tenant);
    END IF;
END;
$tenant$;

-- The tenant_queues side of a transaction's step count changes, applied last and in key order,
-- so that two transactions never hold one tenant's row while waiting for another's. Entries
-- (p_services[i], p_components[i], p_tenants[i], p_running[i], p_activate[i]) for the same
-- queue are summed.
CREATE FUNCTION apply_tenant_deltas(
    p_services text[],
    p_components text[],
    p_tenants text[],
    p_running integer[],
    p_activate boolean[]
)
RETURNS void
LANGUAGE plpgsql
AS $tenants$
DECLARE
    v_change record;
BEGIN
    FOR v_change IN
        SELECT d.service, d.component, d.tenant, sum(d.running)::integer AS running,
               bool_or(d.activate) AS activate
          FROM unnest(p_services, p_components, p_tenants, p_running, p_activate)
               AS d(service, component, tenant, running, activate)
         GROUP BY d.service, d.component, d.tenant
         ORDER BY d.service, d.component, d.tenant
    LOOP
        PERFORM apply_tenant_delta(v_change.service, v_change.component, v_change.tenant,
                                   v_change.running, v_change.activate);
    END LOOP;
END;
$tenants$;
