-- lock_ending_owners: takes the users rows of the owners of a batch of endings' items, first
-- in the endings' lock order and in username order. Waiting for each (the reaper, and an
-- ending the broker has sent back many times, so that none is put off for ever), or taking
-- only the free ones (SKIP LOCKED), so that a batch never holds some users' rows while it
-- waits for others', which claims would then pass over.
--
-- Arguments: the items; whether to wait for owners other transactions hold.
-- Answer: the owners now held, and whether another transaction held some owner (whose endings
-- the caller then leaves alone).
-- Locks: the owners' users rows, FOR NO KEY UPDATE, in username order.

CREATE OR REPLACE FUNCTION lock_ending_owners(
    p_ids bigint[],
    p_wait boolean,
    OUT owners text[],
    OUT some_held boolean
)
LANGUAGE plpgsql
-- Runs from finish_items' generic plans, its only caller.
AS $owners$
DECLARE
    v_wanted text[];
BEGIN
    SELECT array_agg((SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id))
      INTO v_wanted
      FROM unnest(p_ids) AS r(id)
      JOIN work_items wi ON wi.id = r.id;
    IF p_wait THEN
        SELECT coalesce(array_agg(held.username), '{}'), false
          INTO owners, some_held
          FROM (SELECT DISTINCT w.username
                  FROM unnest(v_wanted) AS w(username)
                 ORDER BY w.username) w
         CROSS JOIN LATERAL (SELECT u.username
                               FROM users u
                              WHERE u.username = w.username
                                FOR NO KEY UPDATE) held;
    ELSE
        SELECT coalesce(array_agg(held.username) FILTER (WHERE held.username IS NOT NULL),
                        '{}'),
               count(*) > count(held.username)
          INTO owners, some_held
          FROM (SELECT DISTINCT w.username
                  FROM unnest(v_wanted) AS w(username)
                 ORDER BY w.username) w
          LEFT JOIN LATERAL (SELECT u.username
                               FROM users u
                              WHERE u.username = w.username
                                FOR NO KEY UPDATE SKIP LOCKED) held ON true;
    END IF;
END;
$owners$;
