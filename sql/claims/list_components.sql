-- list_components: what claim_items reads once per (service, querier) of a batch, before its
-- first item for them: the querier's membership, and the fair order's first level, the
-- components with claimable work for the service (an active tenant queue), in name order. A
-- worker visits them from its slot modulo their number, wrapping, until one yields a user
-- (claim_fair_user). Also moves the querier's last_seen when it is due.
--
-- Read once per batch, not per item: a rival tenant that arrives meanwhile is counted from the
-- next batch on, and the reaper's recount covers the claims in between, as it covers a tenant
-- that was alone.
--
-- Arguments: the service, the querier, and how often (milliseconds) an active querier's
-- last_seen moves at most.
-- Answer: querier_state, the querier's state (NULL when it is not a member); components, in
-- name order; contested, for each component whether two or more tenants compete for it.
-- Locks: the queriers row when its last_seen moves (SKIP LOCKED: the row is shared by all of
-- the querier's workers, so one of them moves it and the rest skip).

CREATE OR REPLACE FUNCTION list_components(
    p_service text,
    p_querier text,
    p_touch_ms bigint,
    OUT querier_state text,
    OUT components text[],
    OUT contested boolean[]
)
LANGUAGE plpgsql
AS $components$
DECLARE
    v_stale boolean;
BEGIN
    -- The membership, whether last_seen is due to move, and the components, by a skip scan
    -- over tenant_queues with one probe per component: one statement.
    SELECT q.state::text,
           q.state = 'active'
               AND q.last_seen < now() - p_touch_ms * interval '1 millisecond',
           listed.components,
           listed.contested
      INTO querier_state, v_stale, components, contested
      FROM (SELECT p_querier AS querier) asked
      LEFT JOIN queriers q ON q.querier = asked.querier
     CROSS JOIN LATERAL (
           WITH RECURSIVE found AS (
               (SELECT tq.component
                  FROM tenant_queues tq
                 WHERE tq.service = p_service
                   AND tq.active
                 ORDER BY tq.component
                 LIMIT 1)
               UNION ALL
               SELECT (SELECT tq.component
                         FROM tenant_queues tq
                        WHERE tq.service = p_service
                          AND tq.active
                          AND tq.component > f.component
                        ORDER BY tq.component
                        LIMIT 1)
                 FROM found f
                WHERE f.component IS NOT NULL
           )
           SELECT array_agg(f.component ORDER BY f.component) AS components,
                  -- A second active tenant, read in primary-key order so that the probe
                  -- stops there.
                  array_agg((SELECT tq.tenant
                               FROM tenant_queues tq
                              WHERE tq.service = p_service
                                AND tq.component = f.component
                                AND tq.active
                              ORDER BY tq.service, tq.component, tq.tenant
                             OFFSET 1
                              LIMIT 1) IS NOT NULL
                            ORDER BY f.component) AS contested
             FROM found f
            WHERE f.component IS NOT NULL
           ) listed;
    -- A querier shutting down is not heard: its 410s must not keep it from being forgotten
    -- (retire_queriers.sql).
    IF v_stale THEN
        PERFORM 1
           FROM queriers q
          WHERE q.querier = p_querier
            AND q.state = 'active'
            AND q.last_seen < now() - p_touch_ms * interval '1 millisecond'
            FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE queriers q SET last_seen = now() WHERE q.querier = p_querier;
        END IF;
    END IF;
END;
$components$;
