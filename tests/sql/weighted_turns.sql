-- Weighted turns and tiers (docs/policy-design.md, "Weights at any scale"): where users outnumber
-- workers every share ties at 0, and the tie goes to the earliest pass, which a weight-w turn
-- moves on by 1,000,000 / w from where turn_start says it starts. Tiers come before it all.
BEGIN;
\ir support.psql

SELECT plan(23);

-- p_times claims of one item by one worker, each ended before the next is asked for, so that
-- no user holds an item when the next is chosen: every share is 0, and the turns decide.
-- Answers the users served, in order.
CREATE FUNCTION pg_temp.rounds(p_service text, p_times integer)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_served text[] := '{}';
    v_claim record;
BEGIN
    FOR n IN 1 .. p_times LOOP
        SELECT c.username, c.id INTO v_claim FROM pg_temp.claim(p_service) c;
        EXIT WHEN v_claim.id IS NULL;
        v_served := v_served || v_claim.username;
        PERFORM pg_temp.finish(ARRAY[v_claim.id], ARRAY['successful']);
    END LOOP;
    RETURN v_served;
END;
$$;

-- The clock of a queue's users' order.
CREATE FUNCTION pg_temp.clock(p_service text, p_tenant text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$
    SELECT fc.clock FROM fair_clocks fc
     WHERE (fc.service, fc.component, fc.tenant) = (p_service, 'main', p_tenant);
$$;

-- A user's queue row's pass and fresh flag in a service.
CREATE FUNCTION pg_temp.turn(p_user text, p_service text)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT (su.pass, su.fresh)::text FROM service_users su
     WHERE (su.username, su.service) = (p_user, p_service);
$$;

-- Every user's pass in a service's queue of tenant solo, its name's prefix p_prefix read as u,
-- then the queue's clock: what a batch must leave as the single claims leave it.
CREATE FUNCTION pg_temp.passes(p_service text, p_prefix text)
RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT array_agg(replace(su.username, p_prefix, 'u') || ':' || su.pass ORDER BY su.username)
           || pg_temp.clock(p_service, 'solo')::text
      FROM service_users su
     WHERE su.service = p_service;
$$;

-- 1. The formula.
SELECT is(turn_start(NULL, false, 4, 7000), 7000::bigint,
          'A row never served starts at the clock.');
SELECT is(turn_start(5000, false, 1, 9000), 9000::bigint,
          'With weight 1 a turn starts at the greater of the pass and the clock.');
SELECT is(turn_start(100, false, 4, 1000000), 250000::bigint,
          'A backlogged weight-4 row keeps at most a weight-1 stride less its own of credit.');
SELECT is(turn_start(100, true, 4, 1000000), 1000000::bigint,
          'A fresh row starts at the clock: it banks nothing.');
SELECT is(turn_start(2000000, false, 4, 1000000), 2000000::bigint,
          'A row ahead of the clock starts at its pass.');

-- 2. Users outnumber workers: one worker, users weighted 1, 2 and 4, each item ended before
-- the next claim. In `turns` a rival tenant far ahead makes every claim the one-item path; in
-- `turns-set` the tenant is alone, so claims go through claim_fair_round's sets. The users
-- differ per service because a user's running count spans every service; their names sort
-- alike, since a name breaks the first round's ties.
DO $$
BEGIN
    PERFORM pg_temp.submit('one', 'one', 'turns', 40, 'main');
    PERFORM pg_temp.submit('two', 'two', 'turns', 40, 'main');
    PERFORM pg_temp.submit('four', 'four', 'turns', 80, 'main');
    PERFORM pg_temp.busy_rival('turns', 'rex');
    PERFORM pg_temp.submit('s-one', 's-one', 'turns-set', 40, 'solo');
    PERFORM pg_temp.submit('s-two', 's-two', 'turns-set', 40, 'solo');
    PERFORM pg_temp.submit('s-four', 's-four', 'turns-set', 80, 'solo');
END;
$$;
EXECUTE set_user_policy('two', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('four', 4, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('s-two', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('s-four', 4, NULL, NULL, NULL, NULL);

CREATE TEMP TABLE single_turns AS SELECT pg_temp.rounds('turns', 70) AS served;
CREATE TEMP TABLE set_turns AS SELECT pg_temp.rounds('turns-set', 70) AS served;

SELECT is((SELECT array_agg(n ORDER BY u)
             FROM (SELECT u, count(*)::integer AS n
                     FROM single_turns, unnest(served) u GROUP BY u) c),
          ARRAY[40, 10, 20],
          'Seventy turns go 10, 20 and 40 to weights 1, 2 and 4 (four, one, two).');
SELECT is((SELECT served[1:7] FROM single_turns),
          ARRAY['four', 'one', 'two', 'four', 'two', 'four', 'four'],
          'A round gives a weight-4 user four turns and a weight-2 user two, spread out.');
SELECT is((SELECT ARRAY(SELECT replace(u, 's-', '') FROM unnest(served) u) FROM set_turns),
          (SELECT served FROM single_turns),
          'Claims through sets take the same turns as claims one item at a time.');

-- 3. A batch of k picks against k single claims, from the same state: two services with the
-- same users' history (a tenant alone in each, so the batch is served by sets), then one
-- request of seven items in one and seven single claims in the other, nothing ended.
DO $$
BEGIN
    PERFORM pg_temp.submit('bat1', 'bat1', 'batched', 40, 'solo');
    PERFORM pg_temp.submit('bat2', 'bat2', 'batched', 40, 'solo');
    PERFORM pg_temp.submit('bat4', 'bat4', 'batched', 40, 'solo');
    PERFORM pg_temp.submit('sin1', 'sin1', 'singles', 40, 'solo');
    PERFORM pg_temp.submit('sin2', 'sin2', 'singles', 40, 'solo');
    PERFORM pg_temp.submit('sin4', 'sin4', 'singles', 40, 'solo');
END;
$$;
EXECUTE set_user_policy('bat2', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('bat4', 4, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('sin2', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('sin4', 4, NULL, NULL, NULL, NULL);
DO $$ BEGIN PERFORM pg_temp.rounds('batched', 5), pg_temp.rounds('singles', 5); END; $$;

SELECT is((SELECT array_agg(replace(username, 'bat', 'u') ORDER BY seq)
             FROM pg_temp.claim('batched', 7)),
          (SELECT array_agg(replace(username, 'sin', 'u') ORDER BY seq)
             FROM pg_temp.claims('singles', 7)),
          'A batch of seven takes the turns seven single claims take, in the same order.');
SELECT is(pg_temp.passes('batched', 'bat'), pg_temp.passes('singles', 'sin'),
          'The batch leaves every pass and the clock where the single claims leave them.');

-- 3b. The same with every weight 1, where a set gives a user several picks: each starts from the
-- user's pass after the one before, and the clock may have passed that (take_turns).
DO $$
BEGIN
    FOR n IN 1 .. 3 LOOP
        PERFORM pg_temp.submit('ev' || n, 'ev' || n, 'evenly', 40, 'solo'),
                pg_temp.submit('sg' || n, 'sg' || n, 'singly', 40, 'solo');
    END LOOP;
    PERFORM pg_temp.rounds('evenly', 4), pg_temp.rounds('singly', 4);
END;
$$;

SELECT is((SELECT array_agg(replace(username, 'ev', 'u') ORDER BY seq)
             FROM pg_temp.claim('evenly', 7)),
          (SELECT array_agg(replace(username, 'sg', 'u') ORDER BY seq)
             FROM pg_temp.claims('singly', 7)),
          'With every weight 1 a batch of seven, several picks a user, takes the singles'' turns.');
SELECT is(pg_temp.passes('evenly', 'ev'), pg_temp.passes('singly', 'sg'),
          'That batch leaves every pass and the clock where the single claims leave them.');

-- 4. A returning user starts at the clock. ret, weighted 4, runs out of work while two users
-- weighted 1 take many turns; then work arrives for it again.
DO $$
BEGIN
    PERFORM pg_temp.submit('ret-a', 'ret', 'returning', 4, 'main');
    PERFORM pg_temp.submit('ria', 'ria', 'returning', 60, 'main');
    PERFORM pg_temp.submit('rob', 'rob', 'returning', 60, 'main');
    PERFORM pg_temp.busy_rival('returning', 'rex');
END;
$$;
EXECUTE set_user_policy('ret', 4, NULL, NULL, NULL, NULL);
DO $$
BEGIN
    PERFORM pg_temp.rounds('returning', 40);
    PERFORM pg_temp.submit('ret-b', 'ret', 'returning', 20, 'main');
END;
$$;
CREATE TEMP TABLE ret_before AS
    SELECT pg_temp.clock('returning', 'main') AS clock, pg_temp.turn('ret', 'returning') AS turn;

SELECT is((SELECT turn FROM ret_before) LIKE '(%,t)', true,
          'Work arriving for a user with none ready makes its row fresh.');
SELECT is(pg_temp.rounds('returning', 1), ARRAY['ret'],
          'The returning user, its pass far behind, is served at once.');
SELECT is(pg_temp.turn('ret', 'returning'),
          ((SELECT clock FROM ret_before) + 250000, false)::text,
          'Its turn started at the clock: it banked nothing for its time away.');

-- 5. A capped heavy user keeps at most one round of credit. cap4, weighted 4 and capped at one
-- item, holds an item while two users weighted 1 take many turns; when it ends, cap4 is back,
-- never having run out of work, and its turn starts a weight-1 stride less its own behind.
DO $$
BEGIN
    PERFORM pg_temp.submit('cap4', 'cap4', 'capped', 20, 'main');
    PERFORM pg_temp.submit('cia', 'cia', 'capped', 60, 'main');
    PERFORM pg_temp.submit('cob', 'cob', 'capped', 60, 'main');
    PERFORM pg_temp.busy_rival('capped', 'rex');
END;
$$;
EXECUTE set_user_policy('cap4', 4, 1, NULL, NULL, NULL);
CREATE TEMP TABLE held AS SELECT id FROM pg_temp.claim('capped') WHERE username = 'cap4';
DO $$
BEGIN
    PERFORM pg_temp.rounds('capped', 40);
    PERFORM pg_temp.finish(ARRAY(SELECT id FROM held), ARRAY['successful']);
END;
$$;
CREATE TEMP TABLE cap_before AS SELECT pg_temp.clock('capped', 'main') AS clock;

SELECT is((SELECT array_agg(username) FROM pg_temp.claim('capped')), ARRAY['cap4'],
          'Back under its cap, the heavy user goes first.');
SELECT is(pg_temp.turn('cap4', 'capped'),
          ((SELECT clock FROM cap_before) - 750000 + 250000, false)::text,
          'Its turn starts at most a weight-1 stride less its own behind the clock.');

-- 6. Weights all 1, tiers all 3: the order is the one before turns, (share, last_worked,
-- name), over a long mixed sequence: six users, items ended at random, work arriving anew for
-- users who ran out. Before each claim the old order's head is read from the queue rows.
DO $$
BEGIN
    PERFORM setseed(0.59);
    FOR n IN 1 .. 6 LOOP
        PERFORM pg_temp.submit('mix' || n || '-0', 'mix' || n, 'mixed', 1 + n % 3, 'main');
    END LOOP;
END;
$$;
CREATE TEMP TABLE mixed_log (step integer, expected text, served text);
DO $$
DECLARE
    v_expected text;
    v_claim record;
BEGIN
    FOR step IN 1 .. 200 LOOP
        IF random() < 0.3 THEN
            PERFORM pg_temp.submit('mix' || step, 'mix' || (1 + step % 6), 'mixed',
                                   1 + step % 4, 'main');
        END IF;
        SELECT su.username INTO v_expected
          FROM service_users su
         WHERE su.service = 'mixed' AND su.in_order AND su.ready_count > 0
         ORDER BY su.share, su.last_worked NULLS FIRST, su.username
         LIMIT 1;
        SELECT c.username, c.id INTO v_claim FROM pg_temp.claim('mixed') c;
        INSERT INTO mixed_log VALUES (step, v_expected, v_claim.username);
        -- End a random share of what runs, so that users hold 0 to a few items.
        PERFORM pg_temp.finish(ended, array_fill('successful'::text, ARRAY[cardinality(ended)]))
           FROM (SELECT ARRAY(SELECT wi.id FROM work_items wi
                                JOIN job_steps s USING (job_id)
                               WHERE s.service = 'mixed' AND wi.status = 'running'
                                 AND random() < 0.4
                               ORDER BY wi.id) AS ended) e
          WHERE cardinality(ended) > 0;
    END LOOP;
END;
$$;
SELECT is((SELECT count(*)::integer FROM mixed_log
            WHERE expected IS DISTINCT FROM served),
          0,
          'With weights 1 and tiers 3, 200 mixed claims follow the order before turns exactly.');

-- 7. Tiers come before everything. Within a tenant, a tier-1 user with more in progress is
-- served before tier-3 users with none; among tenants, a tier-1 tenant before a tier-3 one.
DO $$
BEGIN
    PERFORM pg_temp.submit('vip', 'vip', 'tiers', 5, 'main');
    PERFORM pg_temp.submit('pat', 'pat', 'tiers', 5, 'main');
    PERFORM pg_temp.submit('tt-low', 'tlow', 'tenant-tiers', 5, 'low');
    PERFORM pg_temp.submit('tt-top', 'ttop', 'tenant-tiers', 5, 'top');
END;
$$;
EXECUTE set_user_policy('vip', NULL, NULL, NULL, NULL, 1);
EXECUTE upsert_tenant('top', NULL, NULL, NULL, NULL, NULL, NULL, 1);
SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('tiers', 4)),
          ARRAY['vip', 'vip', 'vip', 'vip'],
          'A tier-1 user is served before a tier-3 user with nothing in progress.');
SELECT is((SELECT array_agg(tenant ORDER BY seq) FROM pg_temp.claims('tenant-tiers', 4)),
          ARRAY['top', 'top', 'top', 'top'],
          'A tier-1 tenant is served before a tier-3 tenant with nothing in progress.');

-- 8. Tenants take weighted turns too, where they compete: tenants weighted 1 and 3, one user
-- each, one worker.
DO $$
BEGIN
    PERFORM pg_temp.submit('tw-a', 'twa', 'tenant-turns', 30, 'tw1');
    PERFORM pg_temp.submit('tw-b', 'twb', 'tenant-turns', 60, 'tw3');
END;
$$;
EXECUTE upsert_tenant('tw3', NULL, NULL, 3, NULL, NULL, NULL, NULL);
SELECT is((SELECT array_agg(n ORDER BY u)
             FROM (SELECT u, count(*)::integer AS n
                     FROM unnest(pg_temp.rounds('tenant-turns', 40)) u GROUP BY u) c),
          ARRAY[10, 30],
          'Forty turns go 10 and 30 to tenants weighted 1 and 3.');

-- 9. A strategy's claim takes the user's turn by the same formulas: oldest picks the older
-- job's user, whose pass moves on by its stride from the clock.
DO $$
BEGIN
    PERFORM pg_temp.submit('st-old', 'sto', 'strategic', 5, 'main');
    PERFORM pg_temp.submit('st-new', 'stn', 'strategic', 5, 'main');
END;
$$;
EXECUTE set_user_policy('sto', 4, NULL, NULL, NULL, NULL);
SELECT is((SELECT array_agg(username)
             FROM pg_temp.claim('strategic', 1, 0, 'pod-0',
                                '[{"order": "oldest", "only": [], "caps": []}]')),
          ARRAY['sto'],
          'The oldest job''s user is served by the strategy.');
SELECT is(pg_temp.turn('sto', 'strategic') || pg_temp.clock('strategic', 'main'),
          '(250000,f)0',
          'Its turn started at the clock, 0, and moved its pass on by a weight-4 stride.');

SELECT * FROM finish();
ROLLBACK;
