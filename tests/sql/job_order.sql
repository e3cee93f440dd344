-- The job level of the fair order: within a user (or actor node), synchronous jobs before
-- asynchronous ones, then the job of higher priority, then the job step worked least recently
-- (never worked first), then the step's lowest ready item. Checked on both of claim_items' paths: one-item picks where tenants
-- compete, and claim_fair_round's sets where a tenant is alone.
BEGIN;
\ir support.psql

SELECT plan(17);

-- One user with an asynchronous job of five items never worked, and three synchronous jobs of
-- one item each: one never worked, one worked two hours ago, one an hour ago. A rival tenant
-- with more in progress makes the claims take the one-item path.
DO $$
BEGIN
    PERFORM pg_temp.submit('async', 'joe', 'jobs', 5, 'picks', p_is_async => true);
    PERFORM pg_temp.submit('sync-recent', 'joe', 'jobs', 1, 'picks');
    PERFORM pg_temp.submit('sync-old', 'joe', 'jobs', 1, 'picks');
    PERFORM pg_temp.submit('sync-never', 'joe', 'jobs', 1, 'picks');
    PERFORM pg_temp.submit('rival', 'rex', 'jobs', 3, 'rival');
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('jobs', 'rival');
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES ('sync-recent', interval '1 hour'),
                   ('sync-old', interval '2 hours')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);
END;
$$;

SELECT is((SELECT job FROM pg_temp.claim('jobs')), 'sync-never',
          'A synchronous job never worked goes before an asynchronous one never worked.');
SELECT is((SELECT job FROM pg_temp.claim('jobs')), 'sync-old',
          'Of synchronous jobs worked before, the one worked least recently goes first.');
SELECT is((SELECT job FROM pg_temp.claim('jobs')), 'sync-recent',
          'The synchronous job worked most recently comes after the others.');
SELECT is((SELECT job FROM pg_temp.claim('jobs')), 'async',
          'An asynchronous job is served once no synchronous job has ready items.');
SELECT is((SELECT array_agg(DISTINCT tenant) FROM pg_temp.claim('jobs', 3)), ARRAY['picks'],
          'The rival tenant, with more in progress, stayed behind throughout.');
SELECT results_eq(
    $$SELECT id FROM work_items
       WHERE job_id = pg_temp.job('async') AND status = 'running'
       ORDER BY id$$,
    $$SELECT pg_temp.item('async', n) FROM generate_series(1, 4) n$$,
    'A step hands out its ready items lowest id first: four of five claimed, the first four.');

-- The same shape for a user whose tenant is alone: the claims take claim_fair_round's sets.
DO $$
BEGIN
    PERFORM pg_temp.submit('alone-async', 'jay', 'jobs-alone', 4, 'alone', p_is_async => true);
    PERFORM pg_temp.submit('alone-sync-recent', 'jay', 'jobs-alone', 1, 'alone');
    PERFORM pg_temp.submit('alone-sync-old', 'jay', 'jobs-alone', 1, 'alone');
    PERFORM pg_temp.submit('alone-sync-never', 'jay', 'jobs-alone', 1, 'alone');
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES ('alone-sync-recent', interval '1 hour'),
                   ('alone-sync-old', interval '2 hours')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);
END;
$$;

SELECT is((SELECT job FROM pg_temp.claim('jobs-alone')), 'alone-sync-never',
          'In a set, a synchronous job never worked goes before an asynchronous one.');
SELECT is((SELECT job FROM pg_temp.claim('jobs-alone')), 'alone-sync-old',
          'In a set, the synchronous job worked least recently goes next.');
SELECT is((SELECT job FROM pg_temp.claim('jobs-alone')), 'alone-sync-recent',
          'In a set, the synchronous job worked most recently comes after the others.');
SELECT is((SELECT array_agg(job ORDER BY seq) FROM pg_temp.claim('jobs-alone', 3)),
          ARRAY['alone-async', 'alone-async', 'alone-async'],
          'With only an asynchronous job left, a request for three gets three of its items.');
SELECT results_eq(
    $$SELECT id FROM work_items
       WHERE job_id = pg_temp.job('alone-async') AND status = 'running'
       ORDER BY id$$,
    $$SELECT pg_temp.item('alone-async', n) FROM generate_series(1, 3) n$$,
    'A set takes a step''s ready items lowest id first: three of four claimed, the first three.');

-- Priority inside a user's work: after sync before async, before the least recently worked.
-- On both paths: with a rival tenant (one-item picks), and alone (sets).
DO $$
BEGIN
    PERFORM pg_temp.submit('p9-async', 'pia', 'prio', 1, 'prio', p_is_async => true,
                           p_priority => 9);
    PERFORM pg_temp.submit('p0-old', 'pia', 'prio', 1, 'prio');
    PERFORM pg_temp.submit('p5-recent', 'pia', 'prio', 1, 'prio', p_priority => 5);
    PERFORM pg_temp.submit('p5-never', 'pia', 'prio', 1, 'prio', p_priority => 5);
    PERFORM pg_temp.submit('prio-rival', 'ron', 'prio', 3, 'prio-rival');
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('prio', 'prio-rival');
    PERFORM pg_temp.submit('q0-old', 'quin', 'prio-alone', 1, 'prio-alone');
    PERFORM pg_temp.submit('q5-recent', 'quin', 'prio-alone', 1, 'prio-alone', p_priority => 5);
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES ('p0-old', interval '2 hours'), ('p5-recent', interval '1 hour'),
                   ('q0-old', interval '2 hours'), ('q5-recent', interval '1 hour')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);
END;
$$;

SELECT is((SELECT job FROM pg_temp.claim('prio')), 'p5-never',
          'Of a user''s synchronous jobs the higher priority goes first, never worked first.');
SELECT is((SELECT job FROM pg_temp.claim('prio')), 'p5-recent',
          'A higher priority goes before a job worked less recently.');
SELECT is((SELECT job FROM pg_temp.claim('prio')), 'p0-old',
          'The lower priority comes next.');
SELECT is((SELECT job FROM pg_temp.claim('prio')), 'p9-async',
          'An asynchronous job waits for the synchronous ones whatever its priority.');
SELECT results_eq(
    $$SELECT job FROM pg_temp.claim('prio-alone', 2) ORDER BY seq$$,
    $$VALUES ('q5-recent'), ('q0-old')$$,
    'A set takes the higher priority first too.');
SELECT is((SELECT priority FROM user_work WHERE job_id = pg_temp.job('p9-async')), 9,
          'A step carries its job''s priority.');

SELECT * FROM finish();
ROLLBACK;
