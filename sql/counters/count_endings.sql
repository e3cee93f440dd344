-- count_endings: moves the counters for a batch of ended attempts, each counter row once by
-- the batch's summed deltas, in the endings' transaction. Moves: each step's user_work row
-- (ready and scheduled up for retries, running down, successful and failed up); the owners'
-- users rows (running down) and the copies in the owners' service_users rows that would
-- otherwise lead them; the steps' queues' service_users rows (ready, local counts); and the
-- actor_queues rows of each step's path and its prefixes. Tenant rows are left to the caller,
-- last in its transaction (apply_tenant_deltas).
--
-- Arguments: one entry per ended attempt: its item's job, step, component and the status it
-- ended in ('successful', 'failed', 'ready' or 'scheduled').
-- Answer: a row per step moved: its user, service and tenant, whether it is paused, how many
-- items it still has open (ready, scheduled or running), and whether its user's queue had no
-- claimable work before the batch's retries made some (then a worker may be waiting).
-- Locks: the caller holds the owners' users rows; this takes the user_work rows, then the
-- service_users and actor_queues rows. Runs from its caller's generic plans (finish_items):
-- every statement is a primary-key probe per step or owner whatever the arguments.

CREATE OR REPLACE FUNCTION count_endings(
    p_job_ids uuid[],
    p_step_indexes integer[],
    p_components text[],
    p_statuses text[]
)
RETURNS TABLE (
    job_id uuid,
    step_index integer,
    component text,
    username text,
    service text,
    tenant text,
    paused boolean,
    open_items integer,
    queue_woke boolean
)
LANGUAGE plpgsql
AS $count$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH step_deltas AS (
        SELECT e.job_id, e.step_index, e.component,
               count(*) FILTER (WHERE e.status = 'ready') AS ready,
               count(*) FILTER (WHERE e.status = 'scheduled') AS scheduled,
               count(*) AS ended,
               count(*) FILTER (WHERE e.status = 'successful') AS successful,
               count(*) FILTER (WHERE e.status = 'failed') AS failed
          FROM unnest(p_job_ids, p_step_indexes, p_components, p_statuses)
               AS e(job_id, step_index, component, status)
         GROUP BY e.job_id, e.step_index, e.component
    ), steps AS (
        UPDATE user_work uw
           SET ready_count = uw.ready_count + d.ready,
               scheduled_count = uw.scheduled_count + d.scheduled,
               running_count = uw.running_count - d.ended,
               successful_count = uw.successful_count + d.successful,
               failed_count = uw.failed_count + d.failed
          FROM step_deltas d
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (d.job_id, d.step_index, d.component)
        RETURNING uw.job_id, uw.step_index, uw.component, uw.username, uw.service,
                  uw.tenant, uw.actor, uw.paused, d.ended,
                  -- Paused steps' ready items are not claimable.
                  CASE WHEN uw.paused THEN 0 ELSE d.ready END AS claimable,
                  uw.ready_count + uw.scheduled_count + uw.running_count AS open_items
    ), owners AS (
        UPDATE users u
           SET running_count = u.running_count - o.ended
          FROM (SELECT s.username, sum(s.ended) AS ended
                  FROM steps s
                 GROUP BY s.username) o
         WHERE u.username = o.username
        RETURNING u.username, u.running_count, u.last_worked
    ), queue_deltas AS (
        SELECT s.username, s.service, s.component, s.tenant,
               sum(s.claimable) AS claimable,
               sum(s.claimable) FILTER (WHERE s.actor = '{}') AS local_claimable,
               sum(s.ended) FILTER (WHERE s.actor = '{}') AS local_ended
          FROM steps s
         GROUP BY s.username, s.service, s.component, s.tenant
    ), queues AS (
        -- A copy of the owner's counts may lag them, never lead them (see claim_items):
        -- the ended items' queue rows take their counts and the owner's, and any other row
        -- of the owner only where its copy would otherwise lead. Rows that lag are left
        -- for the claim that finds one at the head of its order, so that a user with work
        -- in many services costs an ending no more rows than one with work in one.
        UPDATE service_users su
           SET running_count = o.running_count,
               last_worked = o.last_worked,
               fresh = su.fresh OR su.ready_count = 0,
               (ready_count, local_ready, local_running) = (
                   SELECT su.ready_count + coalesce(sum(q.claimable), 0),
                          su.local_ready + coalesce(sum(q.local_claimable), 0),
                          su.local_running - coalesce(sum(q.local_ended), 0)
                     FROM queue_deltas q
                    WHERE (q.username, q.service, q.component, q.tenant)
                          = (su.username, su.service, su.component, su.tenant))
          FROM owners o
         WHERE su.username = o.username
           AND (su.running_count > o.running_count
                OR EXISTS (SELECT 1
                             FROM queue_deltas q
                            WHERE (q.username, q.service, q.component, q.tenant)
                                  = (su.username, su.service, su.component, su.tenant)))
        RETURNING su.username, su.service, su.component, su.tenant, su.ready_count
    ), actor_deltas AS (
        -- Each step's path and its prefixes: the nodes above its jobs count them too.
        SELECT s.username, s.service, s.component, s.tenant, s.actor[1:depth] AS path,
               sum(s.claimable) AS claimable,
               sum(s.ended) AS ended,
               sum(s.claimable) FILTER (WHERE depth = cardinality(s.actor))
                   AS local_claimable,
               sum(s.ended) FILTER (WHERE depth = cardinality(s.actor)) AS local_ended
          FROM steps s
         -- (Paths are at most three deep; constant bounds let the planner count the rows.)
         CROSS JOIN generate_series(1, 3) AS depth
         WHERE depth <= cardinality(s.actor)
         GROUP BY s.username, s.service, s.component, s.tenant, s.actor[1:depth]
    ), actors AS (
        UPDATE actor_queues a
           SET ready_count = a.ready_count + d.claimable,
               running_count = a.running_count - d.ended,
               local_ready = a.local_ready + coalesce(d.local_claimable, 0),
               local_running = a.local_running - coalesce(d.local_ended, 0)
          FROM actor_deltas d
         WHERE (a.username, a.service, a.component, a.tenant, a.path)
               = (d.username, d.service, d.component, d.tenant, d.path)
    )
    SELECT s.job_id, s.step_index, s.component, s.username, s.service, s.tenant, s.paused,
           s.open_items,
           -- The queue had nothing claimable before this batch's retries.
           coalesce((SELECT d.claimable > 0 AND q.ready_count <= d.claimable
                       FROM queue_deltas d
                       JOIN queues q
                         ON (q.username, q.service, q.component, q.tenant)
                            = (d.username, d.service, d.component, d.tenant)
                      WHERE (d.username, d.service, d.component, d.tenant)
                            = (s.username, s.service, s.component, s.tenant)),
                    false) AS queue_woke
      FROM steps s;
END;
$count$;
