-- Service policies in the claim: admit_services cuts each request to what the service's cap and
-- rate limit allow, in request order, and says why; claim_items hands out no more; and
-- charge_services bills the bucket for the items taken, not for those allowed.
BEGIN;
\ir support.psql

SELECT plan(14);

SELECT pg_temp.submit('capped', 'ann', 'capped', 6);
SELECT pg_temp.submit('limited', 'bob', 'limited', 6);
SELECT pg_temp.submit('free', 'cid', 'free', 3);
INSERT INTO service_policies (service, max_running) VALUES ('capped', 2);
INSERT INTO service_policies (service, rate_per_second, burst) VALUES ('limited', 1, 3);

-- A batch's requests share their service's allowance in request order; a service without a
-- policy has no row.
SELECT results_eq(
    $$SELECT request, allowed, limited, retry_ms
        FROM admit_services(ARRAY['capped', 'free', 'capped', 'limited'], ARRAY[1, 5, 4, 5])
       ORDER BY request$$,
    $$VALUES (1, 1, NULL::text, NULL::bigint), (3, 1, 'cap', NULL), (4, 3, 'rate', 1000::bigint)$$,
    'Requests share the cap and the bucket in order, and a cut request says which held it.');

SELECT is((SELECT count(*) FROM pg_temp.claim('capped', 5) WHERE id IS NOT NULL), 2::bigint,
          'A claim of five takes only the two items the cap allows.');
SELECT is((SELECT count(*) FROM pg_temp.claim('capped', 1) WHERE id IS NOT NULL), 0::bigint,
          'At its cap the service hands out nothing more.');
SELECT is((SELECT c.limited
             FROM claim_items(ARRAY['capped'], ARRAY['pod-0'], ARRAY[1], ARRAY[1], 300000, 1000,
                              ARRAY[NULL::jsonb], ARRAY[NULL::bigint]) c),
          'cap',
          'The claim says the cap held it back.');

-- An ending frees a slot.
SELECT count(*) FROM pg_temp.finish(ARRAY[(SELECT min(w.id)
                                             FROM work_items w
                                            WHERE w.job_id = pg_temp.job('capped')
                                              AND w.status = 'running')],
                                    ARRAY['successful']);
SELECT is((SELECT count(*) FROM pg_temp.claim('capped', 5) WHERE id IS NOT NULL), 1::bigint,
          'A slot an ending freed is taken, and only that one.');
SELECT is((SELECT count(*)
             FROM work_items w
            WHERE w.job_id = pg_temp.job('capped') AND w.status = 'running'),
          2::bigint,
          'The service never holds more running items than its cap.');

-- The bucket: a burst of three, then one a second. Within the transaction now() stands
-- still, so time passing is next_free moving back.
SELECT is((SELECT count(*) FROM pg_temp.claim('limited', 5) WHERE id IS NOT NULL), 3::bigint,
          'A full bucket lets out its burst.');
SELECT is((SELECT next_free FROM service_policies WHERE service = 'limited'),
          now() + interval '3 seconds',
          'The bucket is billed one interval per item handed out.');
SELECT is((SELECT count(*) FROM pg_temp.claim('limited', 5) WHERE id IS NOT NULL), 0::bigint,
          'An empty bucket lets out nothing.');
SELECT is((SELECT c.retry_ms
             FROM claim_items(ARRAY['limited'], ARRAY['pod-0'], ARRAY[1], ARRAY[1], 300000,
                              1000, ARRAY[NULL::jsonb], ARRAY[NULL::bigint]) c),
          1000::bigint,
          'A claim held back by the rate says when the next item is due.');
SELECT is((SELECT next_free FROM service_policies WHERE service = 'limited'),
          now() + interval '3 seconds',
          'A claim that took nothing bills nothing.');

UPDATE service_policies SET next_free = next_free - interval '1.5 seconds'
 WHERE service = 'limited';
SELECT is((SELECT count(*) FROM pg_temp.claim('limited', 5) WHERE id IS NOT NULL), 1::bigint,
          'After a second and a half one more item is due, not two.');
UPDATE service_policies SET next_free = now() - interval '1 hour' WHERE service = 'limited';
SELECT is((SELECT count(*) FROM pg_temp.claim('limited', 5) WHERE id IS NOT NULL), 2::bigint,
          'A long quiet spell fills the bucket to its burst, no further (two items were left).');
SELECT is((SELECT count(*) FROM pg_temp.claim('free', 5) WHERE id IS NOT NULL), 3::bigint,
          'A service without a policy is not held back.');

SELECT * FROM finish();
ROLLBACK;
