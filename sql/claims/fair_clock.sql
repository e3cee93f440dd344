-- fair_clock: the clock of one weighted order (turn_start), as the claim batch carries it: from
-- the batch's own clocks where it has taken a turn in that order already, else as stored.
--
-- Arguments: the batch's clocks (carry_fair_clock); the order: the users of a (service,
-- component, tenant) queue, or with p_tenant NULL the tenants of a (service, component).
-- Answer: the clock, 0 for an order no turn was ever taken in.

CREATE OR REPLACE FUNCTION fair_clock(
    p_clocks jsonb,
    p_service text,
    p_component text,
    p_tenant text
)
RETURNS bigint
LANGUAGE plpgsql
STABLE
-- PL/pgSQL, not SQL: a SQL function that reads a table is planned afresh on every call.
AS $clock$
DECLARE
    v_clock bigint := carried_fair_clock(p_clocks, p_service, p_component, p_tenant);
BEGIN
    IF v_clock IS NULL AND p_tenant IS NULL THEN
        SELECT fc.clock INTO v_clock
          FROM fair_clocks fc
         WHERE (fc.service, fc.component) = (p_service, p_component)
           AND fc.tenant IS NULL;
    ELSIF v_clock IS NULL THEN
        SELECT fc.clock INTO v_clock
          FROM fair_clocks fc
         WHERE (fc.service, fc.component, fc.tenant) = (p_service, p_component, p_tenant);
    END IF;
    RETURN coalesce(v_clock, 0);
END;
$clock$;
