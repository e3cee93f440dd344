-- Each level of the claim called alone, as claim_items calls it: the batch's start, the
-- components, the tenant and user, the tenant's part, the actor path, the step and its item,
-- and a strategy's step. The other files check the order the levels make together.
BEGIN;
\ir support.psql

SELECT plan(25);

-- Service `levels`: tenants ta (ann and bob, and cat in component zeta) and tb (dan) compete
-- for `main`; `zeta` has ta alone. Service `actors`: una, with her own job and one under actor
-- `ops`. Ann has two items in progress.
DO $$
BEGIN
    PERFORM pg_temp.submit('a1', 'ann', 'levels', 2, 'ta');
    PERFORM pg_temp.submit('b1', 'bob', 'levels', 2, 'ta');
    PERFORM pg_temp.submit('d1', 'dan', 'levels', 2, 'tb');
    PERFORM pg_temp.submit('c1', 'cat', 'levels', 1, 'ta', p_component => 'zeta');
    PERFORM pg_temp.submit('own', 'una', 'actors', 1, 'lone');
    PERFORM pg_temp.submit('ops', 'una', 'actors', 1, 'lone', ARRAY['ops']);
    PERFORM pg_temp.seed_user('ann', 2, now() - interval '1 hour');
    UPDATE queriers SET last_seen = now() - interval '1 hour' WHERE querier = 'pod-1';
END;
$$;

-- The batch's start.
SELECT is((begin_claim_batch(ARRAY['b', 'a', 'b'], ARRAY['pod-1', 'pod-0', 'pod-0'],
                             ARRAY[1, 1, 1])).in_order,
          ARRAY[2, 3, 1],
          'A batch serves its requests by service, then querier, then request order.');
UPDATE users SET throttled_until = now() - interval '1 second' WHERE username = 'bob';
UPDATE service_users SET throttled = true WHERE username = 'bob';
SELECT is((begin_claim_batch(ARRAY['levels'], ARRAY['pod-0'], ARRAY[1])).policed, false,
          'A batch of services without a policy is not policed.');
SELECT is((SELECT (u.throttled_until, su.throttled)::text
             FROM users u JOIN service_users su USING (username)
            WHERE u.username = 'bob'),
          '(,f)',
          'A batch puts a user whose bucket came due back into the fair order.');

-- 1. The components.
SELECT is((SELECT (c.querier_state, c.components, c.contested)::text
             FROM list_components('levels', 'pod-0', 1000) c),
          '(active,"{main,zeta}","{t,f}")',
          'The components with claimable work are listed in name order, with whether tenants compete.');
SELECT is((list_components('levels', 'pod-9', 1000)).querier_state, NULL,
          'A querier that never joined has no state.');
SELECT is((list_components('levels', 'pod-1', 1000)).querier_state, 'active',
          'A member not heard from for an hour is still active.');
SELECT is((SELECT q.last_seen = now() FROM queriers q WHERE q.querier = 'pod-1'), true,
          'Listing moves a querier''s last_seen once it is older than the touch interval.');

-- 2 and 3. The tenant, then the user.
SELECT is((claim_fair_user('levels', 'pod-0', ARRAY['main', 'zeta'], 0, '{}')).username, 'bob',
          'Within the first tenant, the user with least in progress goes (bob, not ann).');
SELECT is((claim_fair_user('levels', 'pod-0', ARRAY['main', 'zeta'], 0,
                           ARRAY[ROW('levels', 'main', 'ta')::text])).username,
          'dan',
          'A tenant passed over for the batch is left out, and the next tenant''s user goes.');
SELECT is((SELECT (u.username, u.component)::text
             FROM claim_fair_user('levels', 'pod-0', ARRAY['main', 'zeta'], 1, '{}') u),
          '(cat,zeta)',
          'A worker visits the components from its slot, modulo their number.');
SELECT is((claim_fair_user('levels', 'pod-0', ARRAY['main'], 0,
                           ARRAY[ROW('levels', 'main', 'ta')::text,
                                 ROW('levels', 'main', 'tb')::text])).username,
          NULL,
          'With every tenant passed over, no user is chosen.');
UPDATE users SET running_count = 5 WHERE username = 'bob';
SELECT is((SELECT (u.username, u.stale)::text
             FROM claim_fair_user('levels', 'pod-0', ARRAY['main'], 0, '{}') u),
          '(bob,t)',
          'A head row whose copies lag its user is answered as stale.');
SELECT is((SELECT su.running_count FROM service_users su WHERE su.username = 'bob'), 5,
          'The stale row is brought level with its user.');
SELECT is((claim_fair_user('levels', 'pod-0', ARRAY['main'], 0, '{}')).username, 'ann',
          'Read again, the order puts the levelled user behind one with less in progress.');

-- The tenant's part.
SELECT is((SELECT (t.passed, t.counted)::text
             FROM claim_tenant_row('levels', 'main', 'ta', false, ARRAY['main'], ARRAY[true],
                                   NULL) t),
          '(f,t)',
          'A tenant with rivals has its queue row count the claim.');
SELECT is((claim_tenant_row('levels', 'zeta', 'ta', false, ARRAY['main'], ARRAY[true],
                            NULL)).counted,
          false,
          'A component missing from the list is asked afresh: ta is alone in zeta.');
SELECT is((claim_tenant_row('levels', 'main', 'ta', false, ARRAY['main'], ARRAY[true],
                            ARRAY['levels', 'main', 'tz'])).passed,
          false,
          'A tenant row sorting before one the transaction holds is taken when it is free.');
UPDATE tenants SET rate_per_second = 1, burst = 1, next_free = now() + interval '1 hour'
 WHERE tenant = 'tb';
SELECT is((SELECT (t.passed, t.limited, t.retry_ms > 0)::text
             FROM claim_tenant_row('levels', 'main', 'tb', true, ARRAY['main'], ARRAY[true],
                                   NULL) t),
          '(t,rate,t)',
          'A rate-limited tenant with an empty bucket is passed over, saying when it is due.');

-- 4. Down the actor tree.
SELECT is(claim_actor_path('una', 'actors', 'main', 'lone', 1, 1, now()), ARRAY['ops'],
          'An actor with less in progress than the user''s own jobs goes before them.');
SELECT is(claim_actor_path('una', 'actors', 'main', 'lone', 1, 0, NULL), '{}'::text[],
          'The user''s own jobs go first when the actor sorts no earlier.');

-- 5 and 6. The step and its item.
SELECT is((claim_step_item('levels', 'main', 'pod-0', 3, NULL, 60000, 'ann', 'ta', '{}', NULL,
                           NULL, false, true, '{}')).id,
          pg_temp.item('a1', 1),
          'The user''s best step gives its lowest ready item.');
SELECT is((SELECT (wi.status, wi.worker, uw.ready_count, uw.running_count, tq.running_count)::text
             FROM work_items wi
             JOIN user_work uw USING (job_id, step_index, component)
             JOIN tenant_queues tq ON (tq.service, tq.component, tq.tenant)
                                      = ('levels', 'main', 'ta')
            WHERE wi.id = pg_temp.item('a1', 1)),
          '(running,3,1,1,1)',
          'The item is leased, and its step''s and its tenant''s counters move with it.');
SELECT is((claim_step_item('levels', 'main', 'pod-0', 0, NULL, 60000, 'nobody', 'ta', '{}',
                           NULL, NULL, false, true, '{}')).id,
          NULL,
          'A user with no ready step gets nothing.');

-- A strategy's step.
SELECT is((claim_strategy_step('levels', 'pod-0', '[{"order": "fair", "only": [], "caps": []}]',
                               '{}', '{}', '{}')).use_fair,
          true,
          'An attempt that is the fair order itself hands the request back to it.');
SELECT is((SELECT (s.chosen, s.job_id = pg_temp.job('c1'))::text
             FROM claim_strategy_step('levels', 'pod-0',
                                      '[{"order": "newest", "only": [], "caps": []}]',
                                      '{}', '{}', '{}') s),
          '(t,t)',
          'An attempt in its order chooses the newest claimable step.');

SELECT * FROM finish();
ROLLBACK;
