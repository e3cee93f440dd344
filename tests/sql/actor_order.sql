-- The actor level of the fair order: below a user, a node's best child actor (least work in
-- progress, then least recently worked) goes before the node's own jobs only when it sorts
-- strictly before them; a claim then counts its item on every node of its path.
BEGIN;
\ir support.psql

SELECT plan(10);

-- One user, alone in its tenant, with jobs of its own and under three actor nodes. Work in
-- progress is seeded as claims would have left it: the user's own jobs at (1, two hours ago),
-- `ops` at (1, an hour ago), `lab` holding (1, three hours ago) itself and its child `lab/x`
-- at (1, four hours ago).
DO $$
BEGIN
    PERFORM pg_temp.submit('own', 'una', 'actors', 3, 'lone');
    PERFORM pg_temp.submit('lab', 'una', 'actors', 3, 'lone', ARRAY['lab']);
    PERFORM pg_temp.submit('lab/x', 'una', 'actors', 3, 'lone', ARRAY['lab', 'x']);
    PERFORM pg_temp.submit('ops', 'una', 'actors', 3, 'lone', ARRAY['ops']);
    PERFORM pg_temp.seed_user('una', 4, now() - interval '1 hour');
    UPDATE service_users
       SET local_running = 1, local_last_worked = now() - interval '2 hours'
     WHERE username = 'una';
    UPDATE actor_queues a
       SET (running_count, last_worked, local_running, local_last_worked)
           = (s.running, now() - s.ago, s.local_running, now() - s.local_ago)
      FROM (VALUES (ARRAY['lab'], 2, interval '3 hours', 1, interval '3 hours'),
                   (ARRAY['lab', 'x'], 1, interval '4 hours', 1, interval '4 hours'),
                   (ARRAY['ops'], 1, interval '1 hour', 1, interval '1 hour'))
           AS s(path, running, ago, local_running, local_ago)
     WHERE (a.username, a.path) = ('una', s.path);
END;
$$;

SELECT is((SELECT actor FROM pg_temp.claim('actors')), '{}'::text[],
          'The user''s own jobs go before an actor with as much in progress worked more recently.');
SELECT is((SELECT actor FROM pg_temp.claim('actors')), ARRAY['ops'],
          'An actor with less in progress than the user''s own jobs goes before them.');
SELECT is((SELECT actor FROM pg_temp.claim('actors')), ARRAY['lab', 'x'],
          'The claim goes down the first actor, then to its child that sorts before its own jobs.');
SELECT is((SELECT actor FROM pg_temp.claim('actors')), '{}'::text[],
          'Of the user''s own jobs and an actor as busy, the one worked less recently goes first.');
SELECT is((SELECT actor FROM pg_temp.claim('actors')), ARRAY['ops'],
          'An actor one item behind the user''s own jobs is served next.');
SELECT is((SELECT actor FROM pg_temp.claim('actors')), ARRAY['lab'],
          'An actor''s own jobs go before a child with more in progress.');

SELECT results_eq(
    $$SELECT path, running_count, local_running
        FROM actor_queues
       WHERE username = 'una'
       ORDER BY path$$,
    $$VALUES (ARRAY['lab'], 4, 2), (ARRAY['lab', 'x'], 2, 2), (ARRAY['ops'], 3, 3)$$,
    'A claim counts its item on every node of its actor path, as local work on the last only.');
SELECT results_eq(
    $$SELECT ready_count, local_ready, local_running FROM service_users WHERE username = 'una'$$,
    $$VALUES (6, 1, 3)$$,
    'The user''s queue row counts six claims off its ready items, its own jobs'' as local work.');

-- A user's own job and a job under an actor, both fresh: a full tie, which the user's own
-- jobs win; the actor, now with less in progress, is next.
DO $$
BEGIN
    PERFORM pg_temp.submit('fresh-own', 'ugo', 'actors-fresh', 2, 'lone');
    PERFORM pg_temp.submit('fresh-dev', 'ugo', 'actors-fresh', 2, 'lone', ARRAY['dev']);
END;
$$;

SELECT is((SELECT actor FROM pg_temp.claim('actors-fresh')), '{}'::text[],
          'Against an actor as busy and as long unworked, the user''s own jobs go first.');
SELECT is((SELECT actor FROM pg_temp.claim('actors-fresh')), ARRAY['dev'],
          'The actor, now with less in progress than the user''s own jobs, goes next.');

SELECT * FROM finish();
ROLLBACK;
