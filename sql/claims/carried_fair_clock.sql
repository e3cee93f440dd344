-- carried_fair_clock: one order's clock as the claim batch carries it (carry_fair_clock), NULL
-- where the batch has taken no turn in that order yet and the stored clock stands.
--
-- Arguments: the batch's clocks; the order, as fair_clock takes it.
-- Answer: the carried clock, or NULL.

CREATE OR REPLACE FUNCTION carried_fair_clock(
    p_clocks jsonb,
    p_service text,
    p_component text,
    p_tenant text
)
RETURNS bigint
LANGUAGE sql
-- STABLE, as jsonb_build_array is: a function declared more constant than its body is not
-- inlined, and a call of its own would cost each claim more than the lookup.
STABLE
AS $carried$
    SELECT (p_clocks ->> jsonb_build_array(p_service, p_component, p_tenant)::text)::bigint;
$carried$;
