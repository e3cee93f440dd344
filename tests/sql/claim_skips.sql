-- What a claim must pass over although the order puts it first: a paused job step, a
-- metadata value at its max_simultaneous cap (and, softly, at a prefer_distinct one), and a
-- tenant sharded to other queriers.
BEGIN;
\ir support.psql

SELECT plan(13);

-- Pauses a job as set_job_paused.sql does: its steps' ready items leave the claimable counts
-- of the user's queue rows (these jobs have no actor path).
CREATE FUNCTION pg_temp.pause(p_label text)
RETURNS void
LANGUAGE sql
AS $$
    WITH steps AS (
        UPDATE user_work
           SET paused = true
         WHERE job_id = pg_temp.job(p_label)
     RETURNING username, service, component, tenant, ready_count
    )
    UPDATE service_users su
       SET ready_count = su.ready_count - s.ready_count,
           local_ready = su.local_ready - s.ready_count
      FROM steps s
     WHERE (su.username, su.service, su.component, su.tenant)
           = (s.username, s.service, s.component, s.tenant);
$$;

-- A user whose synchronous job, never worked and so first in the job order, is paused; its
-- asynchronous job is not. A rival tenant with more in progress makes claims take the
-- one-item path; a second service has the same user shape alone in its tenant, for the sets.
DO $$
BEGIN
    PERFORM pg_temp.submit('held', 'pia', 'paused', 2, 'paused-t');
    PERFORM pg_temp.submit('free', 'pia', 'paused', 2, 'paused-t', p_is_async => true);
    PERFORM pg_temp.submit('rival', 'rex', 'paused', 3, 'rival-t');
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('paused', 'rival-t');
    PERFORM pg_temp.pause('held');
    PERFORM pg_temp.submit('held-alone', 'pol', 'paused-alone', 2, 'alone-t');
    PERFORM pg_temp.submit('free-alone', 'pol', 'paused-alone', 2, 'alone-t', p_is_async => true);
    PERFORM pg_temp.pause('held-alone');
END;
$$;

SELECT is((SELECT array_agg(job ORDER BY seq) FROM pg_temp.claim('paused', 3)),
          ARRAY['free', 'free', 'rival'],
          'A paused job is passed over: its user''s other job is served, then the rival tenant.');
SELECT is((SELECT array_agg(job ORDER BY seq) FROM pg_temp.claim('paused-alone', 3)),
          ARRAY['free-alone', 'free-alone'],
          'A set passes over a paused job too, and stops when only paused work is left.');
SELECT is((SELECT count(*)::integer FROM work_items
            WHERE job_id IN (pg_temp.job('held'), pg_temp.job('held-alone')) AND status = 'ready'),
          4,
          'Every item of the paused jobs is still ready.');

-- Jobs with the metadata key `customer`, submitted in this order: two of customer x, then one
-- of customer y. The strategy reads them oldest first, at most one running per customer.
DO $$
BEGIN
    PERFORM pg_temp.submit('x-1', 'cara', 'capped', 2, p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('x-2', 'cole', 'capped', 2, p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('y-1', 'cruz', 'capped', 2, p_metadata => '{"customer": "y"}');
END;
$$;

-- max_simultaneous of one per customer over the oldest jobs, as the broker normalises it.
CREATE FUNCTION pg_temp.hard_cap()
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT '[{"order": "oldest", "only": [],
              "caps": [{"key": "customer", "max": 1, "hard": true}]}]'::jsonb;
$$;

SELECT is((SELECT job FROM pg_temp.claim('capped', p_strategy => pg_temp.hard_cap())), 'x-1',
          'Under max_simultaneous the oldest job is served while its value is below the cap.');
SELECT is((SELECT job FROM pg_temp.claim('capped', p_strategy => pg_temp.hard_cap())), 'y-1',
          'Jobs whose value is at its cap are passed over for the next value below it.');
SELECT results_eq(
    $$SELECT id, querier_state, passed_over
        FROM pg_temp.claim('capped', p_strategy => pg_temp.hard_cap())$$,
    $$VALUES (NULL::bigint, 'active', false)$$,
    'With every value at its cap the claim gets nothing, and says nothing was held by others.');
SELECT is((SELECT count(*)::integer FROM pg_temp.finish(
               ARRAY(SELECT id FROM work_items
                      WHERE job_id = pg_temp.job('x-1') AND status = 'running'
                      ORDER BY id LIMIT 1),
               ARRAY['successful'])),
          1,
          'The running item of customer x ends.');
SELECT is((SELECT job FROM pg_temp.claim('capped', p_strategy => pg_temp.hard_cap())), 'x-1',
          'An ending frees its value''s capacity for the next claim.');

-- The same jobs under prefer_distinct: the capped attempt first, then the plain order.
DO $$
BEGIN
    PERFORM pg_temp.submit('soft-x-1', 'sam', 'soft', 2, p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('soft-x-2', 'sid', 'soft', 2, p_metadata => '{"customer": "x"}');
    PERFORM pg_temp.submit('soft-y-1', 'sol', 'soft', 2, p_metadata => '{"customer": "y"}');
END;
$$;

-- prefer_distinct of one per customer, then the oldest jobs whatever their customer.
CREATE FUNCTION pg_temp.soft_cap()
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT '[{"order": "oldest", "only": [],
              "caps": [{"key": "customer", "max": 1, "hard": false}]},
             {"order": "oldest", "only": [], "caps": []}]'::jsonb;
$$;

SELECT is((SELECT array_agg(job ORDER BY seq)
             FROM pg_temp.claim('soft', 3, p_strategy => pg_temp.soft_cap())),
          ARRAY['soft-x-1', 'soft-y-1', 'soft-x-1'],
          'prefer_distinct serves each value below its cap first, then the oldest job again.');

-- Tenants sharded to pod-1 only. In one service such a tenant sorts first, ahead of an open
-- tenant with more in progress; in another it is alone.
DO $$
BEGIN
    PERFORM pg_temp.submit('sharded', 'shea', 'shards', 2, 'shard-a');
    PERFORM pg_temp.submit('open', 'otto', 'shards', 2, 'open');
    UPDATE tenant_queues SET running_count = 5 WHERE (service, tenant) = ('shards', 'open');
    PERFORM pg_temp.submit('sharded-alone', 'shaw', 'shards-alone', 2, 'shard-b');
    UPDATE tenants SET sharded = true WHERE tenant IN ('shard-a', 'shard-b');
    INSERT INTO tenant_shards (tenant, querier) VALUES ('shard-a', 'pod-1'), ('shard-b', 'pod-1');
END;
$$;

SELECT is((SELECT tenant FROM pg_temp.claim('shards', p_querier => 'pod-0')), 'open',
          'A querier outside a tenant''s shard passes it over for the next tenant.');
SELECT is((SELECT tenant FROM pg_temp.claim('shards', p_querier => 'pod-1')), 'shard-a',
          'A querier in the tenant''s shard is served its work first.');
SELECT results_eq(
    $$SELECT id, querier_state FROM pg_temp.claim('shards-alone', p_querier => 'pod-0')$$,
    $$VALUES (NULL::bigint, 'active')$$,
    'A querier outside the shard of the only tenant with work gets nothing.');
SELECT is((SELECT job FROM pg_temp.claim('shards-alone', p_querier => 'pod-1')), 'sharded-alone',
          'A querier in that shard gets it.');

SELECT * FROM finish();
ROLLBACK;
