-- The order between a user's steps where only one of them is claimable: claims of a lone step
-- leave its order column (order_worked) behind, so that they update its user_work row without
-- touching an index, and the order is brought level when another step becomes claimable.
-- Checked on both of claim_items' paths: claim_fair_round's sets where a tenant is alone, and
-- one-item picks where tenants compete.
BEGIN;
\ir support.psql

SELECT plan(14);

-- One user, two synchronous jobs: a of three items worked two hours ago, b of one item worked
-- an hour ago.
DO $$
BEGIN
    PERFORM pg_temp.submit('a', 'lev', 'lone', 3, 'lone-t');
    PERFORM pg_temp.submit('b', 'lev', 'lone', 1, 'lone-t');
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES ('a', interval '2 hours'), ('b', interval '1 hour')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);
END;
$$;

SELECT is((SELECT job FROM pg_temp.claim('lone')), 'a',
          'Of two claimable steps, the one worked least recently goes first.');
SELECT is((SELECT job FROM pg_temp.claim('lone')), 'b',
          'Then the other, now worked less recently.');

-- b has nothing ready: a is the user's only claimable step.
CREATE TEMP TABLE step_updates AS
SELECT pg_stat_get_xact_tuples_updated('user_work'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('user_work'::regclass) AS hot;

SELECT is((SELECT job FROM pg_temp.claim('lone')), 'a',
          'With the other step empty, the only claimable step goes.');
SELECT is((SELECT (pg_stat_get_xact_tuples_updated('user_work'::regclass) - s.updated,
                   pg_stat_get_xact_tuples_hot_updated('user_work'::regclass) - s.hot)::text
             FROM step_updates s),
          '(1,1)',
          'A claim of a user''s only claimable step updates its user_work row HOT.');

-- b's item comes back for a retry: b, worked before a's last claim, goes first again.
SELECT is((SELECT count(*)::integer
             FROM pg_temp.finish(ARRAY[(SELECT wi.id
                                          FROM work_items wi
                                         WHERE wi.job_id = pg_temp.job('b'))],
                                 ARRAY['ready'])),
          1,
          'b''s item is ended for a retry.');
SELECT is((SELECT job FROM pg_temp.claim('lone')), 'b',
          'A step claimable again goes before the step claimed alone since it was last worked.');

-- The same where a rival tenant with more in progress makes the claims take one-item picks.
DO $$
BEGIN
    PERFORM pg_temp.submit('pa', 'liv', 'pick', 3, 'pick-t');
    PERFORM pg_temp.submit('pb', 'liv', 'pick', 1, 'pick-t');
    PERFORM pg_temp.submit('rival', 'rex', 'pick', 3, 'pick-rival');
    UPDATE tenant_queues SET running_count = 9 WHERE (service, tenant) = ('pick', 'pick-rival');
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES ('pa', interval '2 hours'), ('pb', interval '1 hour')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);
END;
$$;

SELECT is((SELECT job FROM pg_temp.claim('pick')), 'pa',
          'In a pick, of two claimable steps, the one worked least recently goes first.');
SELECT is((SELECT job FROM pg_temp.claim('pick')), 'pb',
          'In a pick, then the other, now worked less recently.');

-- pb has nothing ready: pa is the user's only claimable step.
CREATE TEMP TABLE pick_updates AS
SELECT pg_stat_get_xact_tuples_updated('user_work'::regclass) AS updated,
       pg_stat_get_xact_tuples_hot_updated('user_work'::regclass) AS hot;

SELECT is((SELECT job FROM pg_temp.claim('pick')), 'pa',
          'In a pick, with the other step empty, the only claimable step goes.');
SELECT is((SELECT (pg_stat_get_xact_tuples_updated('user_work'::regclass) - s.updated,
                   pg_stat_get_xact_tuples_hot_updated('user_work'::regclass) - s.hot)::text
             FROM pick_updates s),
          '(1,1)',
          'A one-item claim of a user''s only claimable step updates its user_work row HOT.');

-- pb's item comes back for a retry: pb, worked before pa's last claim, goes first again.
SELECT is((SELECT count(*)::integer
             FROM pg_temp.finish(ARRAY[(SELECT wi.id
                                          FROM work_items wi
                                         WHERE wi.job_id = pg_temp.job('pb'))],
                                 ARRAY['ready'])),
          1,
          'pb''s item is ended for a retry.');
SELECT is((SELECT job FROM pg_temp.claim('pick')), 'pb',
          'In a pick too, the step claimable again goes first.');

-- A step that becomes claimable writes a new version of its owner's users row: a set that read
-- the user's steps before the change commits, and locks the user after, sees the row changed
-- and stops before the user (claim_fair_round). A step that stays claimable leaves it.
UPDATE user_work SET ready_count = ready_count + 1 WHERE job_id = pg_temp.job('pb');
CREATE TEMP TABLE owner_version AS SELECT ctid AS version FROM users WHERE username = 'liv';
UPDATE user_work SET ready_count = ready_count + 1 WHERE job_id = pg_temp.job('pb');
SELECT is((SELECT u.ctid = v.version FROM users u, owner_version v WHERE u.username = 'liv'), true,
          'A step that stays claimable leaves its owner''s users row as it was.');
UPDATE user_work SET paused = true WHERE job_id = pg_temp.job('pb');
UPDATE owner_version SET version = (SELECT ctid FROM users WHERE username = 'liv');
UPDATE user_work SET paused = false WHERE job_id = pg_temp.job('pb');
SELECT is((SELECT u.ctid = v.version FROM users u, owner_version v WHERE u.username = 'liv'), false,
          'A step that becomes claimable writes a new version of its owner''s users row.');

SELECT * FROM finish();
ROLLBACK;
