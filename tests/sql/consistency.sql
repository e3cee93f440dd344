-- The recounts: the operator's consistency check (check_consistency.sql, the statement behind
-- GET /admin/consistency) finds each counter drifted on purpose, by table and row, and no
-- other; and recount_tenant_running brings a drifted tenant row back to its running items.
BEGIN;
\ir support.psql

-- The check is a statement the broker runs, not a server function, so it is read from its
-- file; the runner starts pg_prove at the repository root.
\set check_consistency `cat crates/fairway-broker/src/counters/check_consistency.sql`
-- As a view, so that the assertions below can pick the mismatch rows apart.
CREATE TEMP VIEW mismatches AS :check_consistency

-- Over tables seeded moments ago the planner's estimates pass jit_above_cost, and compiling
-- the check would take most of this file's time, for a handful of rows.
SET LOCAL jit = off;

SELECT plan(20);

-- A consistent state reached as the broker reaches it: two tenants competing for a component,
-- a job with metadata and one under an actor path, claims, a successful ending and a retry.
DO $$
BEGIN
    PERFORM pg_temp.submit('own', 'vera', 'sums', 3, 'acme', p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('lab', 'vera', 'sums', 2, 'acme', ARRAY['lab', 'x']);
    PERFORM pg_temp.submit('bolt', 'walt', 'sums', 2, 'bolt');
    PERFORM count(*) FROM pg_temp.claim('sums', 6);
    PERFORM count(*)
       FROM pg_temp.finish(ARRAY(SELECT id FROM work_items
                                  WHERE job_id = pg_temp.job('own') AND status = 'running'
                                  ORDER BY id LIMIT 1),
                           ARRAY['successful']);
    PERFORM count(*)
       FROM pg_temp.finish(ARRAY(SELECT id FROM work_items
                                  WHERE job_id = pg_temp.job('lab') AND status = 'running'
                                  ORDER BY id LIMIT 1),
                           ARRAY['ready']);
END;
$$;

SELECT is_empty('SELECT * FROM mismatches',
                'Counters moved only by submissions, claims and endings agree with their recount.');

-- Each drift below is made, checked for, and undone before the next; the check must name
-- exactly the drifted row, with the recorded and recounted values that differ.

UPDATE user_work SET ready_count = ready_count + 1 WHERE job_id = pg_temp.job('lab');
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'job_id', recorded ->> 'ready_count', actual ->> 'ready_count'
        FROM mismatches
       WHERE table_name = 'user_work'$$,
    format('VALUES (%L, %L, %L, %L)', 'user_work', pg_temp.job('lab'), '2', '1'),
    'A step''s ready count one too high is found on that step.');
UPDATE user_work SET ready_count = ready_count - 1 WHERE job_id = pg_temp.job('lab');

UPDATE user_work SET successful_count = 0 WHERE job_id = pg_temp.job('own');
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'job_id', recorded ->> 'successful_count',
             actual ->> 'successful_count'
        FROM mismatches$$,
    format('VALUES (%L, %L, %L, %L)', 'user_work', pg_temp.job('own'), '0', '1'),
    'A step''s successful count that lost an item is found on that step.');
UPDATE user_work SET successful_count = 1 WHERE job_id = pg_temp.job('own');

UPDATE users SET running_count = running_count + 1 WHERE username = 'vera';
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'user', recorded ->> 'running_count',
             actual ->> 'running_count'
        FROM mismatches
       WHERE table_name = 'users'$$,
    $$VALUES ('users', 'vera', '3', '2')$$,
    'A user''s running count one too high is found on the user''s row.');
SELECT is((SELECT array_agg(DISTINCT table_name) FROM mismatches), ARRAY['users'],
          'A queue row''s copy that now lags the user''s count is not a mismatch.');
UPDATE users SET running_count = running_count - 1 WHERE username = 'vera';

UPDATE service_users SET running_count = running_count + 1 WHERE username = 'vera';
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'user', recorded ->> 'running_count',
             actual ->> 'running_count'
        FROM mismatches$$,
    $$VALUES ('service_users', 'vera', '3', '2')$$,
    'A queue row''s copy of the user''s running count that leads it is found on that row.');
UPDATE service_users SET running_count = running_count - 1 WHERE username = 'vera';

UPDATE service_users SET ready_count = ready_count - 1 WHERE username = 'vera';
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'tenant', recorded ->> 'ready_count', actual ->> 'ready_count'
        FROM mismatches$$,
    $$VALUES ('service_users', 'acme', '1', '2')$$,
    'A queue row''s ready count one too low is found on that row.');
UPDATE service_users SET ready_count = ready_count + 1 WHERE username = 'vera';

UPDATE service_users SET local_running = local_running + 1 WHERE username = 'vera';
SELECT results_eq(
    $$SELECT table_name, recorded ->> 'local_running', actual ->> 'local_running' FROM mismatches$$,
    $$VALUES ('service_users', '2', '1')$$,
    'A queue row''s own-jobs running count one too high is found on that row.');
UPDATE service_users SET local_running = local_running - 1 WHERE username = 'vera';

UPDATE actor_queues SET local_running = local_running + 1 WHERE path = ARRAY['lab', 'x'];
SELECT results_eq(
    $$SELECT table_name, row_key -> 'actor', recorded ->> 'local_running',
             actual ->> 'local_running'
        FROM mismatches$$,
    $$VALUES ('actor_queues', '["lab", "x"]'::jsonb, '2', '1')$$,
    'An actor node''s own-jobs running count one too high is found on that node.');
UPDATE actor_queues SET local_running = local_running - 1 WHERE path = ARRAY['lab', 'x'];

UPDATE actor_queues SET ready_count = ready_count + 1 WHERE path = ARRAY['lab'];
SELECT results_eq(
    $$SELECT table_name, row_key -> 'actor', recorded ->> 'ready_count', actual ->> 'ready_count'
        FROM mismatches$$,
    $$VALUES ('actor_queues', '["lab"]'::jsonb, '2', '1')$$,
    'A node''s ready count that disagrees with its subtree is found on that node.');
UPDATE actor_queues SET ready_count = ready_count - 1 WHERE path = ARRAY['lab'];

UPDATE tenant_queues SET active = false WHERE tenant = 'acme';
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'tenant', recorded, actual FROM mismatches$$,
    $$VALUES ('tenant_queues', 'acme', '{"active": false}'::jsonb, '{"active": true}'::jsonb)$$,
    'A tenant queue left inactive while its tenant has ready work is found.');
UPDATE tenant_queues SET active = true WHERE tenant = 'acme';

UPDATE strategy_running SET running = running + 1 WHERE (service, key) = ('sums', 'customer');
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'value', recorded ->> 'running', actual ->> 'running'
        FROM mismatches$$,
    $$VALUES ('strategy_running', 'x', '2', '1')$$,
    'A metadata value''s running count one too high is found on that value.');
UPDATE strategy_running SET running = running - 1 WHERE (service, key) = ('sums', 'customer');

DELETE FROM claimable_steps WHERE job_id = pg_temp.job('own');
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'job_id', recorded ->> 'claimable', actual ->> 'claimable'
        FROM mismatches$$,
    format('VALUES (%L, %L, %L, %L)', 'claimable_steps', pg_temp.job('own'), 'false', 'true'),
    'A step with ready items missing from the claimable steps is found.');
INSERT INTO claimable_steps (job_id, step_index, component, service, tenant, username, seq,
                             priority, shuffle)
SELECT uw.job_id, uw.step_index, uw.component, uw.service, uw.tenant, uw.username, j.seq,
       j.priority, hashtext(uw.job_id::text || '/' || uw.step_index || '/' || uw.component)
  FROM user_work uw
  JOIN jobs j USING (job_id)
 WHERE uw.job_id = pg_temp.job('own');

-- A second claimable step of vera's own: the order between the two reads order_worked.
SELECT pg_temp.submit('own-too', 'vera', 'sums', 1, 'acme');
UPDATE user_work SET order_worked = '2000-01-01' WHERE job_id = pg_temp.job('own');
SELECT results_eq(
    $$SELECT table_name, row_key ->> 'job_id',
             (recorded ->> 'order_worked')::timestamptz = '2000-01-01'
        FROM mismatches$$,
    format('VALUES (%L, %L, true)', 'user_work', pg_temp.job('own')),
    'A step whose order lags its last claim while its user has another claimable step is found.');
UPDATE user_work SET order_worked = last_worked WHERE job_id = pg_temp.job('own');

SELECT is_empty('SELECT * FROM mismatches', 'With every drift undone the counters agree again.');

-- recount_tenant_running. The competing tenant acme keeps its running count as its row plus
-- the changes its endings logged; bolt's row alone.
CREATE VIEW pg_temp.tenant_counts AS
SELECT tq.tenant, tq.running_count,
       (SELECT count(*)::integer
          FROM tenant_running_changes c
         WHERE c.tenant = tq.tenant) AS logged,
       coalesce(a.running, 0) AS running_items
  FROM tenant_queues tq
  LEFT JOIN tenant_queue_running_items a USING (service, component, tenant)
 WHERE tq.service = 'sums';

SELECT results_eq(
    'SELECT tenant, running_count, logged, running_items FROM pg_temp.tenant_counts ORDER BY 1',
    $$VALUES ('acme', 4, 2, 2), ('bolt', 2, 0, 2)$$,
    'Before the recount acme''s row and log add up to its running items, as bolt''s row does.');
SELECT lives_ok('SELECT recount_tenant_running()', 'The recount runs.');
SELECT results_eq(
    'SELECT tenant, running_count, logged FROM pg_temp.tenant_counts ORDER BY 1',
    $$VALUES ('acme', 4, 2), ('bolt', 2, 0)$$,
    'Rows whose count and logged changes add up to their running items are left as they are.');

UPDATE tenant_queues SET running_count = 7 WHERE tenant = 'acme';
UPDATE tenant_queues SET running_count = 0 WHERE tenant = 'bolt';
SELECT lives_ok('SELECT recount_tenant_running()', 'The recount runs over drifted rows.');
SELECT results_eq(
    'SELECT tenant, running_count, logged FROM pg_temp.tenant_counts ORDER BY 1',
    $$VALUES ('acme', 2, 0), ('bolt', 2, 0)$$,
    'Each drifted row takes the count of its running items, and its logged changes are dropped.');

SELECT * FROM finish();
ROLLBACK;
