-- fold_strategy_running: applies the logged running-count changes (strategy_running_changes)
-- to the strategy_running rows it can lock. With NULL arguments, every row with logged changes
-- (the broker's upkeep, so that the log stays short). Given one (service, key, value), as a
-- capped claim does: that row is locked, and its log folded only once it holds 64 changes or
-- more, since folding on every claim costs more than summing a short log. Rows another
-- transaction holds keep their log rows for later: no change is dropped.
--
-- Answer: whether the row given was locked (NULL arguments: whether any was).
-- Locks: the folded strategy_running rows, SKIP LOCKED, held to the caller's commit. The rows
-- are locked first, so that the next statement, in a fresh snapshot, sums every change
-- logged for them and deletes only those.

CREATE OR REPLACE FUNCTION fold_strategy_running(p_service text, p_key text, p_value jsonb)
RETURNS boolean
LANGUAGE plpgsql
AS $fold$
DECLARE
    v_services text[];
    v_keys text[];
    v_values jsonb[];
BEGIN
    IF p_service IS NOT NULL THEN
        SELECT array_agg(r.service), array_agg(r.key), array_agg(r.value)
          INTO v_services, v_keys, v_values
          FROM (SELECT r.service, r.key, r.value
                  FROM strategy_running r
                 WHERE (r.service, r.key, r.value) = (p_service, p_key, p_value)
                   FOR NO KEY UPDATE SKIP LOCKED) r;
    ELSE
        SELECT array_agg(l.service ORDER BY l.service, l.key, l.value),
               array_agg(l.key ORDER BY l.service, l.key, l.value),
               array_agg(l.value ORDER BY l.service, l.key, l.value)
          INTO v_services, v_keys, v_values
          FROM (SELECT DISTINCT c.service, c.key, c.value
                  FROM strategy_running_changes c) c
         CROSS JOIN LATERAL (
               SELECT r.service, r.key, r.value
                 FROM strategy_running r
                WHERE (r.service, r.key, r.value) = (c.service, c.key, c.value)
                  FOR NO KEY UPDATE SKIP LOCKED
               ) l;
    END IF;
    IF v_services IS NULL THEN
        RETURN false;
    END IF;
    IF p_service IS NOT NULL
       AND (SELECT count(*)
              FROM (SELECT
                      FROM strategy_running_changes c
                     WHERE (c.service, c.key, c.value) = (p_service, p_key, p_value)
                     LIMIT 64) c) < 64
    THEN
        RETURN true;
    END IF;
    WITH folded AS (
        DELETE FROM strategy_running_changes c
         USING unnest(v_services, v_keys, v_values) AS l(service, key, value)
         WHERE (c.service, c.key, c.value) = (l.service, l.key, l.value)
     RETURNING c.service, c.key, c.value, c.running
    ), sums AS (
        SELECT f.service, f.key, f.value, sum(f.running)::integer AS running
          FROM folded f
         GROUP BY f.service, f.key, f.value
    )
    UPDATE strategy_running r
       SET running = r.running + s.running
      FROM sums s
     WHERE (r.service, r.key, r.value) = (s.service, s.key, s.value);
    RETURN true;
END;
$fold$;
