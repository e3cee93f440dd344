-- level_queue_rows: brings a user's lagging service_users row level with its users row: the
-- copies of the running count, last worked time and policy (weight, cap, throttled) that the
-- fair order sorts by. Claims move only the queue row they claim from, so a user's rows in its
-- other queues lag it; they never lead it (an ending lowers a row that would). A claim that
-- meets a lagging row at the head of its order calls this, and the lagging rows of free users
-- just behind it (among the first 16) are levelled with it, since where users are claimed in
-- several services those mostly lag too.
--
-- Arguments: the queue (service, component, tenant) and the user whose row was met.
-- Answer: how many rows were levelled.
-- Locks: the lagging users' users rows (FOR NO KEY UPDATE SKIP LOCKED: the caller holds the
-- user it met already), then their service_users rows.

CREATE OR REPLACE FUNCTION level_queue_rows(
    p_service text,
    p_component text,
    p_tenant text,
    p_username text
)
RETURNS integer
LANGUAGE plpgsql
AS $level$
DECLARE
    v_levelled integer;
BEGIN
    UPDATE service_users su
       SET running_count = u.running_count,
           last_worked = u.last_worked,
           weight = u.weight,
           max_running = u.max_running,
           throttled = u.throttled_until IS NOT NULL
      FROM (SELECT h.username
              FROM (SELECT l.username, l.running_count, l.last_worked, l.weight,
                           l.max_running, l.throttled
                      FROM service_users l
                     WHERE (l.service, l.component, l.tenant)
                           = (p_service, p_component, p_tenant)
                       AND l.in_order
                       AND l.ready_count > 0
                     ORDER BY {{user_order l}}
                     LIMIT 16) h
             WHERE h.username = p_username
                OR (SELECT (seen.running_count, seen.last_worked, seen.weight,
                            seen.max_running, seen.throttled_until IS NOT NULL)
                               IS DISTINCT FROM (h.running_count, h.last_worked, h.weight,
                                                 h.max_running, h.throttled)
                      FROM users seen
                     WHERE seen.username = h.username)) lagging
      JOIN LATERAL (SELECT u.running_count, u.last_worked, u.weight, u.max_running,
                           u.throttled_until
                      FROM users u
                     WHERE u.username = lagging.username
                       FOR NO KEY UPDATE SKIP LOCKED) u ON true
     WHERE (su.username, su.service, su.component, su.tenant)
           = (lagging.username, p_service, p_component, p_tenant);
    GET DIAGNOSTICS v_levelled = ROW_COUNT;
    RETURN v_levelled;
END;
$level$;
