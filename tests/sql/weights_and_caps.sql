-- Policies for users and tenants in the claim (docs/policies.md): a weight, a cap on
-- running items and a rate limit, each held by the claim in its own transaction. The user level
-- is checked on both of claim_items' paths: one item at a time where tenants compete, and
-- claim_fair_round's sets where one tenant is alone. The tenant level is checked through
-- admit_tenant, which the claim asks before each item of a policed tenant, and the buckets
-- through the functions every rate limit shares.
BEGIN;
\ir support.psql

SELECT plan(51);

-- The items of user p_user now running, over every service: what a policy holds to, counted
-- from the items rather than from the counters the claim moves.
CREATE FUNCTION pg_temp.running(p_user text)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT count(*)::integer
      FROM work_items wi
      JOIN jobs j USING (job_id)
     WHERE j.username = p_user
       AND wi.status = 'running';
$$;

-- Ends the lowest running item of job p_label successfully, as a worker's report does.
CREATE FUNCTION pg_temp.end_one(p_label text)
RETURNS void
LANGUAGE sql
AS $$
    SELECT count(*)
      FROM pg_temp.finish(ARRAY(SELECT wi.id
                                  FROM work_items wi
                                 WHERE wi.job_id = pg_temp.job(p_label)
                                   AND wi.status = 'running'
                                 ORDER BY wi.id
                                 LIMIT 1),
                          ARRAY['successful']);
$$;

-- 1. Weights at the user level. Three users weighted 1, 2 and 4, never worked, with more work
-- than the claims below take, in three services: in `weighted` a rival tenant far ahead in work
-- in progress makes every claim take the one-item path; in `weighted-set` and `weighted-round`
-- the users' tenant is alone, so a request is served by claim_fair_round. The users differ per
-- service because a user's running count spans every service. Never worked and level, they
-- start in name order; serving a user at k items moves its share to (k + 1) / weight.
DO $$
BEGIN
    PERFORM pg_temp.submit('ann', 'ann', 'weighted', 10, 'main');
    PERFORM pg_temp.submit('ben', 'ben', 'weighted', 10, 'main');
    PERFORM pg_temp.submit('col', 'col', 'weighted', 10, 'main');
    PERFORM pg_temp.busy_rival('weighted', 'rex');
    PERFORM pg_temp.submit('ava', 'ava', 'weighted-set', 10, 'solo');
    PERFORM pg_temp.submit('bea', 'bea', 'weighted-set', 10, 'solo');
    PERFORM pg_temp.submit('cid', 'cid', 'weighted-set', 10, 'solo');
    PERFORM pg_temp.submit('ari', 'ari', 'weighted-round', 10, 'solo');
    PERFORM pg_temp.submit('bel', 'bel', 'weighted-round', 10, 'solo');
    PERFORM pg_temp.submit('cas', 'cas', 'weighted-round', 10, 'solo');
END;
$$;
EXECUTE set_user_policy('ann', 1, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('ben', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('col', 4, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('ava', 1, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('bea', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('cid', 4, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('ari', 1, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('bel', 2, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('cas', 4, NULL, NULL, NULL, NULL);

SELECT results_eq(
    $$SELECT su.username, su.weight FROM service_users su
       WHERE su.service = 'weighted' AND su.tenant = 'main' ORDER BY su.username$$,
    $$VALUES ('ann', 1), ('ben', 2), ('col', 4)$$,
    'Setting a user''s policy copies its weight onto its rows in the fair order.');
SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('weighted', 7)),
          ARRAY['ann', 'ben', 'col', 'col', 'ben', 'col', 'col'],
          'Single claims serve users by running items per unit of weight.');
SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('weighted', 7)),
          ARRAY['ann', 'ben', 'col', 'col', 'ben', 'col', 'col'],
          'Level again after seven claims, the users go round in the same order.');
SELECT is(ARRAY[pg_temp.running('ann'), pg_temp.running('ben'), pg_temp.running('col')],
          ARRAY[2, 4, 8],
          'After fourteen claims users weighted 1, 2 and 4 hold 2, 4 and 8 items.');
SELECT results_eq(
    $$SELECT su.username, su.running_count, su.share FROM service_users su
       WHERE su.service = 'weighted' AND su.tenant = 'main' ORDER BY su.username$$,
    $$VALUES ('ann', 2, 2000000::bigint), ('ben', 4, 2000000::bigint),
             ('col', 8, 2000000::bigint)$$,
    'A row''s share is its running items times a million over its weight: the three stand level.');

-- A new weight reorders at once: ben at 4 items over a weight of 3 (1333333) sorts before the
-- others' 2000000, where ann, worked longest ago, would have come next.
EXECUTE set_user_policy('ben', 3, NULL, NULL, NULL, NULL);
SELECT is((SELECT username FROM pg_temp.claim('weighted')), 'ben',
          'A weight changed by the policy orders the very next claim.');

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('weighted-set', 14)),
          ARRAY['ava', 'bea', 'cid', 'cid', 'bea', 'cid', 'cid',
                'ava', 'bea', 'cid', 'cid', 'bea', 'cid', 'cid'],
          'One request of fourteen in a lone tenant hands out what fourteen single claims would.');

-- claim_fair_round called alone, so that claim_items' single picks cannot make up for a set
-- that stopped short. Where weights differ a set gives each user one pick, and only below the
-- least share any user reaches by a second (cas's 250000): the three at 0, in the order's order.
SELECT is((SELECT array_agg(r.username ORDER BY r.n) FILTER (WHERE r.id IS NOT NULL)
             FROM claim_fair_round('weighted-round', 'pod-0', 'main', ARRAY['weighted-round'],
                                   ARRAY['pod-0'], ARRAY[NULL::jsonb], ARRAY[14], ARRAY[0],
                                   ARRAY[0], ARRAY[NULL::bigint], 300000, '{}')
                  WITH ORDINALITY AS r(request, username, tenant, id, job_id, step_index,
                                       payload, inputs, attempt, lease_expires_at,
                                       traceparent, more, clocks, n)),
          ARRAY['ari', 'bel', 'cas'],
          'A weighted set takes one pick per user, below the least share of a second pick.');

-- With every weight 1 the share is the running count scaled, and the order is the one
-- running_count alone gave (claim_order.sql): users with 2, 0 and 1 in progress, worked two
-- hours ago, never and an hour ago.
DO $$
BEGIN
    PERFORM pg_temp.submit('pam', 'pam', 'unweighted', 5, 'main');
    PERFORM pg_temp.submit('quy', 'quy', 'unweighted', 5, 'main');
    PERFORM pg_temp.submit('roy', 'roy', 'unweighted', 5, 'main');
    PERFORM pg_temp.busy_rival('unweighted', 'rio');
    PERFORM pg_temp.seed_user('pam', 2, now() - interval '2 hours');
    PERFORM pg_temp.seed_user('roy', 1, now() - interval '1 hour');
END;
$$;
EXECUTE set_user_policy('pam', 1, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('quy', 1, NULL, NULL, NULL, NULL);
EXECUTE set_user_policy('roy', 1, NULL, NULL, NULL, NULL);

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('unweighted', 6)),
          ARRAY['quy', 'roy', 'quy', 'pam', 'roy', 'quy'],
          'With every weight 1 users go by running items, then least recently worked.');

-- 2. Weights at the tenant level. Two tenants compete for a component, one user each; heavy,
-- weighted 3, sorts first by name when level. Unweighted they would alternate, four each. At
-- three items each stands at a share of 1000000, and heavy's three turns of 333333 leave its
-- pass the earlier: it goes on.
DO $$
BEGIN
    PERFORM pg_temp.submit('hal', 'hal', 'tenant-weights', 10, 'heavy');
    PERFORM pg_temp.submit('lou', 'lou', 'tenant-weights', 10, 'light');
END;
$$;
EXECUTE upsert_tenant('heavy', NULL, NULL, 3, NULL, NULL, NULL, NULL);

SELECT results_eq(
    $$SELECT tq.tenant, tq.weight FROM tenant_queues tq
       WHERE tq.service = 'tenant-weights' ORDER BY tq.tenant$$,
    $$VALUES ('heavy', 3), ('light', 1)$$,
    'Setting a tenant''s weight copies it onto its queues.');
SELECT is((SELECT array_agg(tenant ORDER BY seq) FROM pg_temp.claims('tenant-weights', 8)),
          ARRAY['heavy', 'light', 'heavy', 'heavy', 'heavy', 'light', 'heavy', 'heavy'],
          'Of eight claims between tenants weighted 3 and 1, the weighted tenant takes six.');
SELECT results_eq(
    $$SELECT tq.tenant, tq.running_count, tq.share FROM tenant_queues tq
       WHERE tq.service = 'tenant-weights' ORDER BY tq.tenant$$,
    $$VALUES ('heavy', 6, 2000000::bigint), ('light', 2, 2000000::bigint)$$,
    'A tenant queue''s share is its running items times a million over its weight.');

-- A tenant weighted before it has a queue: the queue its first work makes copies the weight.
EXECUTE upsert_tenant('late', NULL, NULL, 5, NULL, NULL, NULL, NULL);
DO $$
BEGIN
    PERFORM pg_temp.submit('lee', 'lee', 'tenant-weights', 1, 'late');
END;
$$;
SELECT is((SELECT tq.weight FROM tenant_queues tq
            WHERE (tq.service, tq.tenant) = ('tenant-weights', 'late')),
          5,
          'A tenant queue made after the tenant''s weight was set copies it.');

-- 3. A cap on a user's running items. cora, capped at 2, and finn, with 3 in progress, share a
-- tenant that a rival keeps on the one-item path: uncapped, cora would take every claim here.
DO $$
BEGIN
    PERFORM pg_temp.submit('cora', 'cora', 'user-cap', 5, 'main');
    PERFORM pg_temp.submit('finn', 'finn', 'user-cap', 5, 'main');
    PERFORM pg_temp.busy_rival('user-cap', 'rob');
    PERFORM pg_temp.seed_user('finn', 3, now() - interval '1 hour');
END;
$$;
EXECUTE set_user_policy('cora', NULL, 2, NULL, NULL, NULL);

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('user-cap', 3)),
          ARRAY['cora', 'cora', 'finn'],
          'A user at its cap is passed over: after its second item the next user is served.');
SELECT results_eq(
    $$SELECT su.running_count, su.max_running, su.in_order FROM service_users su
       WHERE (su.username, su.service) = ('cora', 'user-cap')$$,
    $$VALUES (2, 2, false)$$,
    'At its cap the user''s row leaves the fair order.');
SELECT pg_temp.end_one('cora');
SELECT results_eq(
    $$SELECT su.running_count, su.in_order FROM service_users su
       WHERE (su.username, su.service) = ('cora', 'user-cap')$$,
    $$VALUES (1, true)$$,
    'An ending below the cap puts the row back in the order.');
SELECT is((SELECT username FROM pg_temp.claim('user-cap')), 'cora',
          'The next claim serves the user again.');

-- The same cap in a set: cam, capped at 2, and fay in a lone tenant, one request of five.
DO $$
BEGIN
    PERFORM pg_temp.submit('cam', 'cam', 'user-cap-set', 5, 'solo');
    PERFORM pg_temp.submit('fay', 'fay', 'user-cap-set', 5, 'solo');
END;
$$;
EXECUTE set_user_policy('cam', NULL, 2, NULL, NULL, NULL);

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('user-cap-set', 5)),
          ARRAY['cam', 'fay', 'cam', 'fay', 'fay'],
          'A set gives a capped user no more picks than its cap leaves, and the rest to others.');
-- A request of one makes a set of one pick per user at the head, whatever the user's cap
-- would allow: only the row leaving the order keeps cam, at 2 items the head, from it.
SELECT is((SELECT username FROM pg_temp.claim('user-cap-set')), 'fay',
          'A set of one item passes over the user at its cap too.');

-- A cap whose copy lags: lars takes an item, then his users row gets a cap of 1 that his row
-- in the order does not show (no statement copies it). After lena's first pick the two stand
-- at one item each and lars, worked earlier, comes to the head of the order, where his row
-- says he may still be served.
DO $$
BEGIN
    PERFORM pg_temp.submit('lars', 'lars', 'lagging-cap', 5, 'solo');
    PERFORM pg_temp.submit('lena', 'lena', 'lagging-cap', 5, 'solo');
END;
$$;
SELECT is((SELECT username FROM pg_temp.claim('lagging-cap')), 'lars',
          'Before his cap the first claim serves lars.');
UPDATE users SET max_running = 1 WHERE username = 'lars';

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('lagging-cap', 3)),
          ARRAY['lena', 'lena', 'lena'],
          'A claim that meets a row whose cap lags its user holds the user to the cap.');
SELECT is(pg_temp.running('lars'), 1,
          'A user never runs more items than its cap, even when its rows lag.');
SELECT results_eq(
    $$SELECT su.max_running, su.in_order FROM service_users su
       WHERE (su.username, su.service) = ('lars', 'lagging-cap')$$,
    $$VALUES (1, false)$$,
    'The claim that met the lagging row brought its copy of the cap level, out of the order.');

-- 4. A rate limit on a user: one a second, a burst of two. rita and sam (3 in progress) share
-- a tenant a rival keeps on the one-item path; unlimited, rita would take every claim. Within
-- the transaction now() stands still, so time passing is next_free and throttled_until moving
-- back together, as they would against a clock.
DO $$
BEGIN
    PERFORM pg_temp.submit('rita', 'rita', 'user-rate', 5, 'main');
    PERFORM pg_temp.submit('sam', 'sam', 'user-rate', 5, 'main');
    PERFORM pg_temp.busy_rival('user-rate', 'rue');
    PERFORM pg_temp.seed_user('sam', 3, now() - interval '1 hour');
END;
$$;
EXECUTE set_user_policy('rita', NULL, NULL, 1, 2, NULL);

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claims('user-rate', 3)),
          ARRAY['rita', 'rita', 'sam'],
          'A user with a burst of two gets two items, then the claim passes it over.');
SELECT results_eq(
    $$SELECT u.next_free, u.throttled_until FROM users u WHERE u.username = 'rita'$$,
    $$VALUES (now() + interval '2 seconds', now() + interval '1 second')$$,
    'The empty bucket is billed two intervals, and throttled_until says when the next is due.');
SELECT results_eq(
    $$SELECT su.throttled, su.in_order FROM service_users su
       WHERE (su.username, su.service) = ('rita', 'user-rate')$$,
    $$VALUES (true, false)$$,
    'Out of tokens, the user''s row is throttled and out of the fair order.');

UPDATE users
   SET next_free = next_free - interval '1 second',
       throttled_until = throttled_until - interval '1 second'
 WHERE username = 'rita';
-- Any claim releases the users whose next item is due, whatever it asks for.
DO $$
BEGIN
    PERFORM count(*) FROM pg_temp.claim('no-such-service');
END;
$$;
SELECT results_eq(
    $$SELECT u.throttled_until, su.throttled, su.in_order
        FROM users u JOIN service_users su USING (username)
       WHERE (u.username, su.service) = ('rita', 'user-rate')$$,
    $$VALUES (NULL::timestamptz, false, true)$$,
    'A second later the next claim releases the user: its row is back in the order.');
SELECT is((SELECT username FROM pg_temp.claim('user-rate')), 'rita',
          'The released user is served again.');
SELECT results_eq(
    $$SELECT u.throttled_until, su.throttled FROM users u JOIN service_users su USING (username)
       WHERE (u.username, su.service) = ('rita', 'user-rate')$$,
    $$VALUES (now() + interval '1 second', true)$$,
    'One token had come due, so that one item empties the bucket again.');

-- Rows made now, for another component of a step, copy their users' policies as they stand:
-- col's weight of 4, cora's cap of 2 (which her two items reach) and rita's empty bucket.
SELECT create_step_queues(pg_temp.job('col'), 0, ARRAY['side']);
SELECT create_step_queues(pg_temp.job('cora'), 0, ARRAY['side']);
SELECT create_step_queues(pg_temp.job('rita'), 0, ARRAY['side']);
SELECT results_eq(
    $$SELECT su.username, su.weight, su.max_running, su.throttled, su.in_order
        FROM service_users su
       WHERE su.component = 'side'
       ORDER BY su.username$$,
    $$VALUES ('col', 4, 0, false, true), ('cora', 1, 2, false, false),
             ('rita', 1, 0, true, false)$$,
    'A user''s new row in the fair order copies its counts, weight, cap and throttle, in or out.');

-- The same limit in a set: ria, limited, and sol (3 in progress) in a lone tenant, one request
-- of five.
DO $$
BEGIN
    PERFORM pg_temp.submit('ria', 'ria', 'user-rate-set', 5, 'solo');
    PERFORM pg_temp.submit('sol', 'sol', 'user-rate-set', 5, 'solo');
    PERFORM pg_temp.seed_user('sol', 3, now() - interval '1 hour');
END;
$$;
EXECUTE set_user_policy('ria', NULL, NULL, 1, 2, NULL);

SELECT is((SELECT array_agg(username ORDER BY seq) FROM pg_temp.claim('user-rate-set', 5)),
          ARRAY['ria', 'ria', 'sol', 'sol', 'sol'],
          'A set gives a rate-limited user no more picks than its bucket holds.');
SELECT results_eq(
    $$SELECT u.next_free, u.throttled_until FROM users u WHERE u.username = 'ria'$$,
    $$VALUES (now() + interval '2 seconds', now() + interval '1 second')$$,
    'A set bills the bucket for every pick it gave the user.');
-- As for the cap: ria, at 2 items, is at the head, and only her row leaving the order keeps a
-- set of one pick from her.
SELECT is((SELECT username FROM pg_temp.claim('user-rate-set')), 'sol',
          'A set of one item passes over the user out of tokens too.');

-- 5. A tenant's cap and rate, admitted one item at a time by admit_tenant. tight, capped at one
-- running item, competes with open, which has 5 in progress: by the order tight always goes
-- first. metered, limited to one a second with a burst of two, is alone in its service.
DO $$
BEGIN
    PERFORM pg_temp.submit('tia', 'tia', 'tenant-cap', 5, 'tight');
    PERFORM pg_temp.submit('oli', 'oli', 'tenant-cap', 5, 'open');
    UPDATE tenant_queues SET running_count = 5 WHERE (service, tenant) = ('tenant-cap', 'open');
    PERFORM pg_temp.submit('tom', 'tom', 'tight-only', 5, 'tight');
    PERFORM pg_temp.submit('ron', 'ron', 'tenant-rate', 5, 'metered');
END;
$$;
EXECUTE upsert_tenant('tight', NULL, NULL, NULL, 1, NULL, NULL, NULL);
EXECUTE upsert_tenant('metered', NULL, NULL, NULL, NULL, 1, 2, NULL);

SELECT results_eq('SELECT * FROM admit_tenant(''tight'')', $$VALUES (NULL::text, NULL::bigint)$$,
                  'A tenant under its cap is admitted.');
SELECT is((SELECT array_agg(tenant ORDER BY seq) FROM pg_temp.claims('tenant-cap', 3)),
          ARRAY['tight', 'open', 'open'],
          'A tenant at its cap is passed over and the claim serves the other tenant.');
SELECT results_eq('SELECT * FROM admit_tenant(''tight'')', $$VALUES ('cap', NULL::bigint)$$,
                  'A tenant at its cap is refused for the cap.');
SELECT results_eq(
    $$SELECT id IS NULL, limited FROM claim_items(ARRAY['tight-only'], ARRAY['pod-0'], ARRAY[0],
                                                ARRAY[1], 300000, 1000, ARRAY[NULL::jsonb],
                                                ARRAY[NULL::bigint])$$,
    $$VALUES (true, 'cap')$$,
    'The cap counts the tenant''s items in every service, and the claim says the cap held it.');
SELECT pg_temp.end_one('tia');
SELECT is((SELECT tenant FROM pg_temp.claim('tenant-cap')), 'tight',
          'An ending brings the tenant under its cap, and the next claim serves it again.');

SELECT results_eq('SELECT * FROM admit_tenant(''metered'')', $$VALUES (NULL::text, NULL::bigint)$$,
                  'A tenant with tokens in its bucket is admitted.');
SELECT is((SELECT count(*)::integer FROM pg_temp.claim('tenant-rate', 5) WHERE id IS NOT NULL),
          2,
          'A rate-limited tenant lets out its burst and no more.');
SELECT results_eq('SELECT * FROM admit_tenant(''metered'')', $$VALUES ('rate', 1000::bigint)$$,
                  'A tenant with an empty bucket is refused for the rate, and told when to retry.');
SELECT results_eq(
    $$SELECT id IS NULL, limited, retry_ms
        FROM claim_items(ARRAY['tenant-rate'], ARRAY['pod-0'], ARRAY[0], ARRAY[1], 300000, 1000,
                         ARRAY[NULL::jsonb], ARRAY[NULL::bigint])$$,
    $$VALUES (true, 'rate', 1000::bigint)$$,
    'A claim held back by the tenant''s rate gets nothing and says when the next item is due.');

-- 6. The buckets every rate limit keeps: one time, next_free, and an emission interval of
-- 1 / rate rounded up to a microsecond. now() stands still within the transaction, so the
-- times compare exactly.
SELECT is(bucket_tokens(1, 3, NULL), 3::bigint,
          'A bucket never charged (next_free NULL) is full: it lets out its burst.');
SELECT is(bucket_charged(1, NULL, 3), now() + interval '3 seconds',
          'Each item moves next_free on by one interval, from now for a full bucket.');
SELECT is(bucket_tokens(1, 3, bucket_charged(1, NULL, 3)), 0::bigint,
          'Charged its whole burst, a bucket lets out nothing.');
SELECT is(bucket_tokens(1, 3, now() + interval '1.5 seconds'), 1::bigint,
          'A bucket refills one whole item per interval, not a fraction.');
SELECT is(bucket_charged(2, now() - interval '1 hour', 1), now() + interval '0.5 seconds',
          'A next_free long past counts from now: a quiet spell fills no more than the burst.');
SELECT is(bucket_due(1, 3, bucket_charged(1, NULL, 2)), NULL,
          'While a token is left no item is waited for: bucket_due is NULL.');
SELECT is(bucket_due(1, 3, bucket_charged(1, NULL, 3)), now() + interval '1 second',
          'An empty bucket''s next item is due one interval later.');
SELECT is(bucket_charged(3, NULL, 3), now() + interval '1000002 microseconds',
          'The interval is rounded up to a microsecond, so the rate is never exceeded.');
SELECT is(ARRAY[retry_ms_until(now() + interval '1 second'), retry_ms_until(now())],
          ARRAY[1000::bigint, 1::bigint],
          'A claim is told to look again when the item is due, and never in less than 1 ms.');

SELECT * FROM finish();
ROLLBACK;
