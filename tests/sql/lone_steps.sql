-- The order between a user's steps where only one of them is claimable: claims of a lone step
-- leave its order column (order_worked) behind, so that they update its user_work row without
-- touching an index, and the order is brought level when another step becomes claimable.
-- Checked on both of claim_items' paths: claim_fair_round's sets where a tenant is alone, and
-- one-item picks where tenants compete.
BEGIN;
\ir support.psql

SELECT plan(17);

-- User p_user of service p_service (tenant p_tenant), with two synchronous jobs: <p_user>-a of
-- three items worked two hours ago, <p_user>-b of one item worked an hour ago; with p_rival, a
-- rival tenant with more in progress makes the claims take one-item picks. p_path names the
-- path in the assertions.
CREATE FUNCTION pg_temp.lone_step_order(
    p_path text,
    p_service text,
    p_user text,
    p_tenant text,
    p_rival text DEFAULT NULL
)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    v_a text := p_user || '-a';
    v_b text := p_user || '-b';
    v_updated bigint;
    v_hot bigint;
BEGIN
    PERFORM pg_temp.submit(v_a, p_user, p_service, 3, p_tenant);
    PERFORM pg_temp.submit(v_b, p_user, p_service, 1, p_tenant);
    IF p_rival IS NOT NULL THEN
        PERFORM pg_temp.submit(p_rival, p_rival, p_service, 3, p_rival);
        UPDATE tenant_queues SET running_count = 9
         WHERE (service, tenant) = (p_service, p_rival);
    END IF;
    UPDATE user_work uw
       SET (last_worked, order_worked) = (now() - s.ago, now() - s.ago)
      FROM (VALUES (v_a, interval '2 hours'), (v_b, interval '1 hour')) AS s(job, ago)
     WHERE uw.job_id = pg_temp.job(s.job);

    RETURN NEXT is((SELECT job FROM pg_temp.claim(p_service)), v_a,
                   p_path || ': of two claimable steps, the one worked least recently goes.');
    RETURN NEXT is((SELECT job FROM pg_temp.claim(p_service)), v_b,
                   p_path || ': then the other, now worked less recently.');

    -- b has nothing ready: a is the user's only claimable step.
    v_updated := pg_stat_get_xact_tuples_updated('user_work'::regclass);
    v_hot := pg_stat_get_xact_tuples_hot_updated('user_work'::regclass);
    RETURN NEXT is((SELECT job FROM pg_temp.claim(p_service)), v_a,
                   p_path || ': with the other step empty, the only claimable step goes.');
    RETURN NEXT is(
        (pg_stat_get_xact_tuples_updated('user_work'::regclass) - v_updated,
         pg_stat_get_xact_tuples_hot_updated('user_work'::regclass) - v_hot)::text,
        '(1,1)',
        p_path || ': a claim of a user''s only claimable step updates its user_work row HOT.');

    -- b's item comes back for a retry: b, worked before a's last claim, goes first again.
    RETURN NEXT is((SELECT count(*)::integer
                      FROM pg_temp.finish(ARRAY[(SELECT wi.id
                                                   FROM work_items wi
                                                  WHERE wi.job_id = pg_temp.job(v_b))],
                                          ARRAY['ready'])),
                   1,
                   p_path || ': b''s item is ended for a retry.');
    RETURN NEXT is((SELECT job FROM pg_temp.claim(p_service)), v_b,
                   p_path || ': a step claimable again goes before the step claimed alone since.');
END;
$$;

SELECT * FROM pg_temp.lone_step_order('In a set', 'lone', 'lev', 'lone-t');
SELECT * FROM pg_temp.lone_step_order('In a pick', 'pick', 'liv', 'pick-t', 'pick-rival');

-- A step that becomes claimable records its transaction on its owner's users row: a set that
-- read the user's steps before the change commits, and locks the user after, sees another
-- transaction there and stops before the user (claim_fair_round). A step that stays claimable
-- leaves the row, and the transaction writes it once however many steps it makes claimable.
UPDATE user_work SET ready_count = ready_count + 1 WHERE job_id = pg_temp.job('liv-b');
UPDATE users SET step_made_claimable_by = NULL WHERE username = 'liv';
UPDATE user_work SET ready_count = ready_count + 1 WHERE job_id = pg_temp.job('liv-b');
SELECT is((SELECT step_made_claimable_by FROM users WHERE username = 'liv'), NULL,
          'A step that stays claimable leaves its owner''s row as it was.');
UPDATE user_work SET paused = true WHERE job_id = pg_temp.job('liv-b');
UPDATE user_work SET paused = false WHERE job_id = pg_temp.job('liv-b');
SELECT is((SELECT step_made_claimable_by FROM users WHERE username = 'liv'), pg_current_xact_id(),
          'A step that becomes claimable records its transaction on its owner''s row.');
CREATE TEMP TABLE owner_version AS SELECT ctid AS version FROM users WHERE username = 'liv';
UPDATE user_work SET paused = true WHERE job_id = pg_temp.job('liv-b');
UPDATE user_work SET paused = false WHERE job_id = pg_temp.job('liv-b');
SELECT is((SELECT u.ctid = v.version FROM users u, owner_version v WHERE u.username = 'liv'), true,
          'A second step made claimable in the transaction leaves its owner''s row as it was.');

-- A claim of a step a strategy named writes the step's order column even where the step is its
-- user's only claimable one: the lone-step probe is not asked for it (claim_step_item).
SELECT pg_temp.submit('sol-a', 'sol', 'strat', 3, 'sol-t');
UPDATE user_work
   SET (last_worked, order_worked) = (now() - interval '1 hour', now() - interval '1 hour')
 WHERE job_id = pg_temp.job('sol-a');
SELECT is((SELECT job
             FROM pg_temp.claim('strat',
                                p_strategy => '[{"order": "oldest", "only": [], "caps": []}]')),
          'sol-a', 'A strategy claims a user''s only claimable step.');
SELECT is((SELECT order_worked = last_worked FROM user_work WHERE job_id = pg_temp.job('sol-a')),
          true, 'A strategy''s claim of a lone step writes its order column.');

SELECT * FROM finish();
ROLLBACK;
