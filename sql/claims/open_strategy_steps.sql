-- open_strategy_steps: a cursor over the claimable steps of a service in the order one
-- attempt of a claim strategy reads them (README "Claim strategies"), from the head of that
-- order's index: oldest and newest by the job's submission order, priority by the job's
-- priority then submission order, random from a random cut of a hash fixed per step, wrapping.
-- `fair` under a filter or a cap is read in submission order: the fair order cannot be filtered
-- without walking users. Under a select_only filter the first filter picks the index
-- (claimable_step_metadata); the caller checks the rest per step. Each order reads at most 256
-- steps, the bound claim_strategy_step keeps; saying so lets the planner read them from the
-- head of the order's index.
--
-- Arguments: the service, the attempt's order, and its first select_only filter
-- ({"key", "value"}, or NULL).
-- Answer: the open cursor, yielding (job_id, step_index, component, tenant); tenant is NULL
-- when read from the metadata index.
-- Locks: none.

CREATE OR REPLACE FUNCTION open_strategy_steps(p_service text, p_order text, p_only jsonb)
RETURNS refcursor
LANGUAGE plpgsql
AS $steps$
DECLARE
    v_cursor refcursor;
    v_key text := p_only ->> 'key';
    v_value jsonb := p_only -> 'value';
    v_cut integer := (floor(random() * 4294967296) - 2147483648)::integer;
BEGIN
    IF p_only IS NULL THEN
        IF p_order = 'newest' THEN
            OPEN v_cursor FOR
                SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                  FROM claimable_steps cs
                 WHERE cs.service = p_service
                 ORDER BY cs.seq DESC
                 LIMIT 256;
        ELSIF p_order = 'priority' THEN
            OPEN v_cursor FOR
                SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                  FROM claimable_steps cs
                 WHERE cs.service = p_service
                 ORDER BY cs.priority DESC, cs.seq
                 LIMIT 256;
        ELSIF p_order = 'random' THEN
            -- Cut the deck at a random place, and wrap. (The cut as a subquery, so that
            -- no plan is made for one cut's row count.)
            OPEN v_cursor FOR
                (SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                   FROM claimable_steps cs
                  WHERE cs.service = p_service
                    AND cs.shuffle >= (SELECT v_cut)
                  ORDER BY cs.shuffle
                  LIMIT 256)
                UNION ALL
                (SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                   FROM claimable_steps cs
                  WHERE cs.service = p_service
                    AND cs.shuffle < (SELECT v_cut)
                  ORDER BY cs.shuffle
                  LIMIT 256)
                LIMIT 256;
        ELSE
            -- oldest, and fair under a filter or a cap (see the header).
            OPEN v_cursor FOR
                SELECT cs.job_id, cs.step_index, cs.component, cs.tenant
                  FROM claimable_steps cs
                 WHERE cs.service = p_service
                 ORDER BY cs.seq
                 LIMIT 256;
        END IF;
    ELSE
        IF p_order = 'newest' THEN
            OPEN v_cursor FOR
                SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                  FROM claimable_step_metadata cm
                 WHERE (cm.service, cm.key, cm.value)
                       = (p_service, v_key, v_value)
                 ORDER BY cm.seq DESC
                 LIMIT 256;
        ELSIF p_order = 'priority' THEN
            OPEN v_cursor FOR
                SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                  FROM claimable_step_metadata cm
                 WHERE (cm.service, cm.key, cm.value)
                       = (p_service, v_key, v_value)
                 ORDER BY cm.priority DESC, cm.seq
                 LIMIT 256;
        ELSIF p_order = 'random' THEN
            OPEN v_cursor FOR
                (SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                   FROM claimable_step_metadata cm
                  WHERE (cm.service, cm.key, cm.value)
                        = (p_service, v_key, v_value)
                    AND cm.shuffle >= (SELECT v_cut)
                  ORDER BY cm.shuffle
                  LIMIT 256)
                UNION ALL
                (SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                   FROM claimable_step_metadata cm
                  WHERE (cm.service, cm.key, cm.value)
                        = (p_service, v_key, v_value)
                    AND cm.shuffle < (SELECT v_cut)
                  ORDER BY cm.shuffle
                  LIMIT 256)
                LIMIT 256;
        ELSE
            OPEN v_cursor FOR
                SELECT cm.job_id, cm.step_index, cm.component, NULL::text
                  FROM claimable_step_metadata cm
                 WHERE (cm.service, cm.key, cm.value)
                       = (p_service, v_key, v_value)
                 ORDER BY cm.seq
                 LIMIT 256;
        END IF;
    END IF;
    RETURN v_cursor;
END;
$steps$;
