-- What an ending (finish_items) moves: the item itself, its step's counts, the user's running
-- count and its queue row's copy, the actor path's nodes, the tenant's running count (row plus
-- logged changes) while tenants compete, the strategy count of the job's metadata, and the
-- step's place among the claimable steps. Each counter is compared before and after each kind
-- of ending; a stale attempt moves nothing.
BEGIN;
\ir support.psql

SELECT plan(55);

-- Every counter an ending of job p_label's items may move, by name.
CREATE FUNCTION pg_temp.counters(p_label text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object(
               'step_ready', uw.ready_count,
               'step_running', uw.running_count,
               'step_successful', uw.successful_count,
               'step_failed', uw.failed_count,
               'user_running', u.running_count,
               'queue_ready', su.ready_count,
               'queue_running', su.running_count,
               'queue_local_ready', su.local_ready,
               'queue_local_running', su.local_running,
               'actor_ready', coalesce(a.ready_count, 0),
               'actor_running', coalesce(a.running_count, 0),
               'actor_local_running', coalesce(a.local_running, 0),
               'parent_actor_running', coalesce(p.running_count, 0),
               'tenant_running',
               tq.running_count
                   + coalesce((SELECT sum(c.running)
                                 FROM tenant_running_changes c
                                WHERE (c.service, c.component, c.tenant)
                                      = (tq.service, tq.component, tq.tenant)), 0),
               'strategy_running',
               (SELECT coalesce(sum(r.running
                                    + coalesce((SELECT sum(l.running)
                                                  FROM strategy_running_changes l
                                                 WHERE (l.service, l.key, l.value)
                                                       = (r.service, r.key, r.value)), 0)), 0)
                  FROM strategy_running r
                  JOIN job_metadata m ON (m.key, m.value) = (r.key, r.value)
                 WHERE m.job_id = uw.job_id
                   AND r.service = uw.service),
               'claimable',
               (SELECT count(*) FROM claimable_steps cs WHERE cs.job_id = uw.job_id))
      FROM user_work uw
      JOIN users u ON u.username = uw.username
      JOIN service_users su
        ON (su.username, su.service, su.component, su.tenant)
           = (uw.username, uw.service, uw.component, uw.tenant)
      JOIN tenant_queues tq
        ON (tq.service, tq.component, tq.tenant) = (uw.service, uw.component, uw.tenant)
      LEFT JOIN actor_queues a
        ON (a.username, a.service, a.component, a.tenant, a.path)
           = (uw.username, uw.service, uw.component, uw.tenant, uw.actor)
      LEFT JOIN actor_queues p
        ON (p.username, p.service, p.component, p.tenant, p.path)
           = (uw.username, uw.service, uw.component, uw.tenant, uw.actor[1:1])
       AND cardinality(uw.actor) > 1
     WHERE uw.job_id = pg_temp.job(p_label);
$$;

CREATE TABLE pg_temp.snapshots (
    taken    serial PRIMARY KEY,
    label    text   NOT NULL,
    counters jsonb  NOT NULL
);

CREATE PROCEDURE pg_temp.snapshot(p_label text)
LANGUAGE sql
AS $$
    INSERT INTO pg_temp.snapshots (label, counters) VALUES (p_label, pg_temp.counters(p_label));
$$;

-- How far p_counter of job p_label moved between its last two snapshots.
CREATE FUNCTION pg_temp.moved(p_label text, p_counter text)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT (array_agg((s.counters ->> p_counter)::integer ORDER BY s.taken DESC))[1]
           - (array_agg((s.counters ->> p_counter)::integer ORDER BY s.taken DESC))[2]
      FROM pg_temp.snapshots s
     WHERE s.label = p_label;
$$;

-- The counters of job p_label that moved between its last two snapshots, with their values
-- then and now.
CREATE FUNCTION pg_temp.changed(p_label text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT coalesce(jsonb_object_agg(latest.key,
                                     jsonb_build_array(earlier.counters -> latest.key,
                                                       latest.value)),
                    '{}')
      FROM (SELECT s.counters
              FROM pg_temp.snapshots s
             WHERE s.label = p_label
             ORDER BY s.taken DESC
            OFFSET 1
             LIMIT 1) earlier,
           jsonb_each((SELECT s.counters
                         FROM pg_temp.snapshots s
                        WHERE s.label = p_label
                        ORDER BY s.taken DESC
                        LIMIT 1)) latest
     WHERE latest.value IS DISTINCT FROM earlier.counters -> latest.key;
$$;

-- One user with a job of its own (three items, metadata customer=x) and one under the actor
-- path lab/x (two items), in a tenant that competes with another, so that its running count
-- is kept. Every item of the user is claimed; the rival has more in progress throughout.
DO $$
BEGIN
    PERFORM pg_temp.submit('own', 'eve', 'ends', 3, 'acme', p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('lab', 'eve', 'ends', 2, 'acme', ARRAY['lab', 'x']);
    PERFORM pg_temp.submit('rival', 'rob', 'ends', 2, 'rival');
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('ends', 'rival');
    PERFORM count(*) FROM pg_temp.claim('ends', 5);
END;
$$;

SELECT is((SELECT count(*)::integer FROM work_items wi JOIN jobs j USING (job_id)
            WHERE j.username = 'eve' AND wi.status = 'running'),
          5,
          'Every item of the user is running before the endings.');

-- A successful ending of the user's own job.
CALL pg_temp.snapshot('own');
SELECT results_eq(
    $$SELECT became_claimable, job_open_items, deferred
        FROM pg_temp.finish(ARRAY[pg_temp.item('own', 1)], ARRAY['successful'])$$,
    $$VALUES (false, 2, false)$$,
    'A successful ending applies, wakes nobody, and leaves the job two items open.');
CALL pg_temp.snapshot('own');
SELECT results_eq(
    $$SELECT status::text, ended_as::text, lease_expires_at IS NULL, attempt
        FROM work_items
       WHERE id = pg_temp.item('own', 1)$$,
    $$VALUES ('successful', 'successful', true, 1)$$,
    'The item is successful, recorded as such, and holds no lease.');
SELECT is(pg_temp.moved('own', 'step_running'), -1,
          'A successful ending takes its item off its step''s running count.');
SELECT is(pg_temp.moved('own', 'step_successful'), 1,
          'It adds the item to its step''s successful count.');
SELECT is(pg_temp.moved('own', 'step_failed'), 0, 'It leaves the step''s failed count.');
SELECT is(pg_temp.moved('own', 'step_ready'), 0, 'It leaves the step''s ready count.');
SELECT is(pg_temp.moved('own', 'user_running'), -1,
          'It takes the item off the user''s running count.');
SELECT is(pg_temp.moved('own', 'queue_running'), -1,
          'The user''s queue row copies the lower running count.');
SELECT is(pg_temp.moved('own', 'queue_local_running'), -1,
          'The queue row''s own-jobs running count falls for a job without an actor.');
SELECT is(pg_temp.moved('own', 'queue_ready'), 0, 'The queue row''s ready count stays.');
SELECT is(pg_temp.moved('own', 'tenant_running'), -1,
          'The tenant''s running count falls while tenants compete.');
SELECT is(pg_temp.moved('own', 'strategy_running'), -1,
          'The running count of the job''s metadata value falls.');
SELECT is(pg_temp.moved('own', 'claimable'), 0,
          'A step with no ready items stays out of the claimable steps.');

-- A failed ending under the actor path lab/x.
CALL pg_temp.snapshot('lab');
SELECT is((SELECT count(*)::integer
             FROM pg_temp.finish(ARRAY[pg_temp.item('lab', 1)], ARRAY['failed'])),
          1,
          'A failed ending applies.');
CALL pg_temp.snapshot('lab');
SELECT is((SELECT status::text FROM work_items WHERE id = pg_temp.item('lab', 1)), 'failed',
          'The item is failed.');
SELECT is(pg_temp.moved('lab', 'step_running'), -1,
          'A failed ending takes its item off its step''s running count.');
SELECT is(pg_temp.moved('lab', 'step_failed'), 1, 'It adds the item to its step''s failed count.');
SELECT is(pg_temp.moved('lab', 'step_successful'), 0, 'It leaves the step''s successful count.');
SELECT is(pg_temp.moved('lab', 'user_running'), -1,
          'It takes the item off the user''s running count.');
SELECT is(pg_temp.moved('lab', 'queue_running'), -1,
          'The user''s queue row copies the lower running count.');
SELECT is(pg_temp.moved('lab', 'queue_local_running'), 0,
          'The queue row''s own-jobs running count stays for a job under an actor.');
SELECT is(pg_temp.moved('lab', 'actor_running'), -1,
          'The running count of the job''s actor node falls.');
SELECT is(pg_temp.moved('lab', 'actor_local_running'), -1,
          'So does that node''s own-jobs running count.');
SELECT is(pg_temp.moved('lab', 'parent_actor_running'), -1,
          'And the running count of the node above it.');
SELECT is(pg_temp.moved('lab', 'tenant_running'), -1, 'The tenant''s running count falls.');

-- A retry at once of the own job's second item: its step has no ready item until then, nor
-- has the user's queue.
CALL pg_temp.snapshot('own');
SELECT results_eq(
    $$SELECT became_claimable, job_open_items
        FROM pg_temp.finish(ARRAY[pg_temp.item('own', 2)], ARRAY['ready'])$$,
    $$VALUES (true, 2)$$,
    'A retry applies, says the user''s work became claimable, and leaves the job two items open.');
CALL pg_temp.snapshot('own');
SELECT results_eq(
    $$SELECT status::text, lease_expires_at IS NULL, attempt
        FROM work_items
       WHERE id = pg_temp.item('own', 2)$$,
    $$VALUES ('ready', true, 1)$$,
    'The retried item is ready, holds no lease, and keeps its attempt number.');
SELECT is(pg_temp.moved('own', 'step_ready'), 1,
          'A retry adds the item to its step''s ready count.');
SELECT is(pg_temp.moved('own', 'step_running'), -1,
          'It takes the item off the step''s running count.');
SELECT is(pg_temp.moved('own', 'step_successful') + pg_temp.moved('own', 'step_failed'), 0,
          'It counts the item neither successful nor failed.');
SELECT is(pg_temp.moved('own', 'user_running'), -1,
          'It takes the item off the user''s running count.');
SELECT is(pg_temp.moved('own', 'queue_ready'), 1,
          'The user''s queue row counts the item ready again.');
SELECT is(pg_temp.moved('own', 'queue_local_ready'), 1, 'As its own jobs'' ready work.');
SELECT is(pg_temp.moved('own', 'queue_local_running'), -1,
          'And no longer as its own jobs'' running work.');
SELECT is(pg_temp.moved('own', 'tenant_running'), -1, 'The tenant''s running count falls.');
SELECT ok((SELECT active FROM tenant_queues WHERE (service, tenant) = ('ends', 'acme')),
          'The tenant''s queue is active, so that claims find the retried item.');
SELECT is(pg_temp.moved('own', 'strategy_running'), -1,
          'The running count of the job''s metadata value falls.');
SELECT is(pg_temp.moved('own', 'claimable'), 1, 'The step is claimable again.');

-- A stale report: an attempt the item is not on.
CALL pg_temp.snapshot('lab');
SELECT is((SELECT count(*)::integer
             FROM finish_items(ARRAY[pg_temp.item('lab', 2)], ARRAY[7], ARRAY['successful'],
                               ARRAY['[]'::jsonb], ARRAY[NULL::text], ARRAY[NULL::text],
                               ARRAY[NULL::bytea], ARRAY[false], false, false)),
          0,
          'An ending for an attempt the item is not on does not apply.');
CALL pg_temp.snapshot('lab');
SELECT is(pg_temp.changed('lab'), '{}'::jsonb, 'A stale ending moves no counter.');

-- Two endings in one batch, of both jobs: each counter moves by their sum, the tenant's last.
CALL pg_temp.snapshot('own');
CALL pg_temp.snapshot('lab');
SELECT results_eq(
    $$SELECT id = pg_temp.item('own', 3), deferred
        FROM pg_temp.finish(ARRAY[pg_temp.item('own', 3), pg_temp.item('lab', 2)],
                            ARRAY['successful', 'successful'])$$,
    $$VALUES (true, false), (false, false)$$,
    'Both endings of a batch apply.');
CALL pg_temp.snapshot('own');
CALL pg_temp.snapshot('lab');
SELECT is(pg_temp.moved('own', 'user_running'), -2,
          'The user''s running count falls by both items.');
SELECT is(pg_temp.moved('own', 'tenant_running'), -2,
          'The tenant''s running count falls by both items.');
SELECT is(pg_temp.moved('own', 'step_successful') + pg_temp.moved('lab', 'step_successful'), 2,
          'Each step counts its item successful.');
SELECT is(pg_temp.moved('lab', 'parent_actor_running'), -1,
          'The actor path''s nodes count the one item under them.');
SELECT results_eq(
    $$SELECT u.running_count, su.running_count, su.ready_count
        FROM users u
        JOIN service_users su USING (username)
       WHERE username = 'eve'$$,
    $$VALUES (0, 0, 1)$$,
    'In the end the user has nothing running, and only the retried item is ready.');

-- Every batch is one statement: a workflow grows in it, and it finishes the jobs it empties
-- and applies its tenant rows' changes itself.
DO $$
BEGIN
    PERFORM pg_temp.submit('solo', 'eve', 'ends', 2, 'acme');
    PERFORM pg_temp.submit('grows', 'eve', 'ends', 1, 'acme');
    INSERT INTO job_steps (job_id, step_index, service, aggregate)
    VALUES (pg_temp.job('grows'), 1, 'next', false);
    PERFORM pg_temp.submit('gathers', 'eve', 'ends', 1, 'acme');
    INSERT INTO job_steps (job_id, step_index, service, aggregate)
    VALUES (pg_temp.job('gathers'), 1, 'sum', true);
    PERFORM count(*) FROM pg_temp.claim('ends', 5);
END;
$$;

-- Ends items p_ids with results p_results and statuses p_statuses, as one statement.
CREATE FUNCTION pg_temp.finish_alone(p_ids bigint[], p_results jsonb[], p_statuses text[])
RETURNS TABLE (id bigint, job_open_items integer)
LANGUAGE sql
AS $$
    SELECT p_ids[f.ending], f.job_open_items
      FROM finish_items(p_ids,
                        ARRAY(SELECT 1 FROM unnest(p_ids)),
                        p_statuses,
                        p_results,
                        array_fill(NULL::text, ARRAY[cardinality(p_ids)]),
                        array_fill(NULL::text, ARRAY[cardinality(p_ids)]),
                        array_fill(NULL::bytea, ARRAY[cardinality(p_ids)]),
                        array_fill(false, ARRAY[cardinality(p_ids)]),
                        false, false) f
     ORDER BY f.ending;
$$;

SELECT results_eq(
    $$SELECT id, job_open_items
        FROM pg_temp.finish_alone(ARRAY[pg_temp.item('solo', 1), pg_temp.item('grows', 1)],
                                  ARRAY['[]'::jsonb, '[1]'], ARRAY['successful', 'successful'])$$,
    $$VALUES (pg_temp.item('solo', 1), 1), (pg_temp.item('grows', 1), 1)$$,
    'A batch in which a workflow fans out applies, each job with an item open.');
SELECT results_eq(
    $$SELECT status::text, inputs
        FROM work_items
       WHERE job_id = pg_temp.job('grows')
         AND step_index = 1$$,
    $$VALUES ('ready', '[1]'::jsonb)$$,
    'The same statement made the next step''s item from the result.');
SELECT is((SELECT ready_count FROM service_users WHERE (username, service) = ('eve', 'next')),
          1,
          'And counted it ready in the next service''s queue.');
SELECT results_eq(
    $$SELECT id, job_open_items
        FROM pg_temp.finish_alone(ARRAY[pg_temp.item('gathers', 1)], ARRAY['["x"]'::jsonb],
                                  ARRAY['successful'])$$,
    $$VALUES (pg_temp.item('gathers', 1), 1)$$,
    'An ending that completes an aggregate''s inputs applies, with the aggregate open.');
SELECT is((SELECT inputs
             FROM work_items
            WHERE job_id = pg_temp.job('gathers')
              AND step_index = 1),
          '["x"]'::jsonb,
          'The aggregate''s item carries the results of the step before.');

CALL pg_temp.snapshot('solo');
SELECT results_eq(
    $$SELECT id, job_open_items
        FROM pg_temp.finish_alone(ARRAY[pg_temp.item('solo', 2)], ARRAY['[]'::jsonb],
                                  ARRAY['successful'])$$,
    $$VALUES (pg_temp.item('solo', 2), 0)$$,
    'The last item of a job ends with nothing of the job open.');
CALL pg_temp.snapshot('solo');
SELECT is(pg_temp.moved('solo', 'tenant_running'), -1,
          'The tenant''s running count falls, with no caller to apply it.');
SELECT is((SELECT status::text FROM jobs WHERE job_id = pg_temp.job('solo')), 'successful',
          'The job it emptied is finished in the same statement.');

SELECT * FROM finish();
ROLLBACK;
