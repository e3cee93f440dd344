-- The fair order's upper levels as claim_items walks them: components by the worker's slot,
-- tenants and users by work in progress and then least recently worked (never worked counting
-- as longest ago). Users are checked on both of claim_items' paths: the sets claim_fair_round
-- takes when one tenant is alone in the order, and the one-item picks when tenants compete.
BEGIN;
\ir support.psql

SELECT plan(19);

-- Users of a tenant alone in its component, each with work to spare: two with one item in
-- progress worked at different times, one with one in progress never worked (a count seeded
-- without a time), and one with two in progress worked longest ago.
DO $$
BEGIN
    PERFORM pg_temp.submit('ann', 'ann', 'single', 3, 'solo');
    PERFORM pg_temp.submit('bob', 'bob', 'single', 3, 'solo');
    PERFORM pg_temp.submit('cat', 'cat', 'single', 3, 'solo');
    PERFORM pg_temp.submit('dee', 'dee', 'single', 3, 'solo');
    PERFORM pg_temp.seed_user('ann', 2, now() - interval '3 hours');
    PERFORM pg_temp.seed_user('bob', 1, now() - interval '1 hour');
    PERFORM pg_temp.seed_user('cat', 1, now() - interval '2 hours');
    PERFORM pg_temp.seed_user('dee', 1, NULL);
END;
$$;

SELECT is((SELECT username FROM pg_temp.claim('single')), 'dee',
          'Among users with the least work in progress, one never worked goes first.');
SELECT is((SELECT username FROM pg_temp.claim('single')), 'cat',
          'Then the user with as little in progress that was worked least recently.');
SELECT is((SELECT username FROM pg_temp.claim('single')), 'bob',
          'The last user at the lowest level comes before anyone with more in progress.');
SELECT is((SELECT username FROM pg_temp.claim('single')), 'ann',
          'At the next level the user who was there before anyone was raised to it goes first.');
SELECT is((SELECT username FROM pg_temp.claim('single')), 'dee',
          'Users raised to a level follow in the order they were raised.');

-- The same order asked for in one request of five: claim_fair_round's set must choose what
-- five single claims would.
DO $$
BEGIN
    PERFORM pg_temp.submit('amy', 'amy', 'set', 3, 'solo');
    PERFORM pg_temp.submit('ben', 'ben', 'set', 3, 'solo');
    PERFORM pg_temp.submit('cal', 'cal', 'set', 3, 'solo');
    PERFORM pg_temp.submit('dot', 'dot', 'set', 3, 'solo');
    PERFORM pg_temp.seed_user('amy', 2, now() - interval '3 hours');
    PERFORM pg_temp.seed_user('ben', 1, now() - interval '1 hour');
    PERFORM pg_temp.seed_user('cal', 1, now() - interval '2 hours');
    PERFORM pg_temp.seed_user('dot', 1, NULL);
END;
$$;

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('set', 5)),
          ARRAY['dot', 'cal', 'ben', 'amy', 'dot'],
          'A request for five items of a lone tenant gets them as five single claims would.');

-- Tenants competing for one component, one user each: work in progress seeded on the tenant
-- rows, as claims and endings keep it while rivals exist.
DO $$
BEGIN
    PERFORM pg_temp.submit('nor', 'nor', 'tenants', 3, 'north');
    PERFORM pg_temp.submit('sue', 'sue', 'tenants', 3, 'south');
    PERFORM pg_temp.submit('eli', 'eli', 'tenants', 3, 'east');
    PERFORM pg_temp.submit('wes', 'wes', 'tenants', 3, 'west');
    UPDATE tenant_queues tq
       SET (running_count, last_worked) = (s.running, s.last_worked)
      FROM (VALUES ('north', 2, now() - interval '3 hours'),
                   ('south', 1, now() - interval '1 hour'),
                   ('east', 1, now() - interval '2 hours'),
                   ('west', 1, NULL::timestamptz)) AS s(tenant, running, last_worked)
     WHERE (tq.service, tq.tenant) = ('tenants', s.tenant);
END;
$$;

SELECT is((SELECT tenant FROM pg_temp.claim('tenants')), 'west',
          'Among tenants with the least work in progress, one never worked goes first.');
SELECT is((SELECT tenant FROM pg_temp.claim('tenants')), 'east',
          'Then the tenant with as little in progress that was worked least recently.');
SELECT is((SELECT tenant FROM pg_temp.claim('tenants')), 'south',
          'The last tenant at the lowest level comes before any with more in progress.');
SELECT is((SELECT tenant FROM pg_temp.claim('tenants')), 'north',
          'At the next level the tenant that was there first goes first.');
SELECT is((SELECT running_count FROM tenant_queues WHERE (service, tenant) = ('tenants', 'north')),
          3,
          'A claim counts its item on the tenant row while tenants compete.');

-- Users within a tenant that competes with another: the one-item path. The rival tenant has
-- more in progress than the five claims below will give the first.
DO $$
BEGIN
    PERFORM pg_temp.submit('ida', 'ida', 'contested', 3, 'main');
    PERFORM pg_temp.submit('jon', 'jon', 'contested', 3, 'main');
    PERFORM pg_temp.submit('kim', 'kim', 'contested', 3, 'main');
    PERFORM pg_temp.submit('lea', 'lea', 'contested', 3, 'main');
    PERFORM pg_temp.submit('ray', 'ray', 'contested', 3, 'rival');
    PERFORM pg_temp.seed_user('ida', 2, now() - interval '3 hours');
    PERFORM pg_temp.seed_user('jon', 1, now() - interval '1 hour');
    PERFORM pg_temp.seed_user('kim', 1, now() - interval '2 hours');
    PERFORM pg_temp.seed_user('lea', 1, NULL);
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('contested', 'rival');
END;
$$;

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('contested', 5)),
          ARRAY['lea', 'kim', 'jon', 'ida', 'lea'],
          'Where tenants compete, users are picked one item at a time in the same order.');
SELECT is((SELECT array_agg(DISTINCT tenant) FROM work_items wi JOIN jobs j USING (job_id)
            WHERE wi.status = 'running' AND j.username IN ('ida', 'jon', 'kim', 'lea', 'ray')),
          ARRAY['main'],
          'The tenant with less in progress kept every item while its count stayed lower.');

-- Components: one tenant and user each. A worker starts at the component its slot names
-- (slot modulo their number, in name order), and moves on, wrapping, past one with nothing
-- ready.
DO $$
BEGIN
    PERFORM pg_temp.submit('c1', 'uma', 'components', 2, p_component => 'c1');
    PERFORM pg_temp.submit('c2', 'vic', 'components', 1, p_component => 'c2');
    PERFORM pg_temp.submit('c3', 'wyn', 'components', 2, p_component => 'c3');
END;
$$;

SELECT is((SELECT component FROM pg_temp.claim('components', p_worker => 1)), 'c2',
          'Worker slot 1 of three components starts at the second.');
SELECT is((SELECT component FROM pg_temp.claim('components', p_worker => 2)), 'c3',
          'Worker slot 2 starts at the third.');
SELECT is((SELECT component FROM pg_temp.claim('components', p_worker => 3)), 'c1',
          'Worker slot 3 wraps round to the first.');
SELECT is((SELECT component FROM pg_temp.claim('components', p_worker => 1)), 'c3',
          'A worker whose component has nothing ready left is served by the next one.');
SELECT is((SELECT component FROM pg_temp.claim('components', p_worker => 2)), 'c1',
          'Past the last component the search wraps round to the first.');
SELECT is((SELECT querier_state FROM pg_temp.claim('components', p_querier => 'pod-9')), NULL,
          'A querier that never joined is told so and gets nothing.');

SELECT * FROM finish();
ROLLBACK;
