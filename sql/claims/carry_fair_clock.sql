-- carry_fair_clock: the batch's clocks with one order's clock moved on (carried_fair_clock reads
-- them): a batch writes each clock once, at its end (save_fair_clocks), not once per item.
--
-- Arguments: the batch's clocks; the order, as fair_clock takes it; the clock.
-- Answer: the batch's clocks.

CREATE OR REPLACE FUNCTION carry_fair_clock(
    p_clocks jsonb,
    p_service text,
    p_component text,
    p_tenant text,
    p_clock bigint
)
RETURNS jsonb
LANGUAGE sql
-- STABLE, as carried_fair_clock is, so that it is inlined.
STABLE
AS $carry$
    SELECT p_clocks
           || jsonb_build_object(jsonb_build_array(p_service, p_component, p_tenant)::text,
                                 p_clock);
$carry$;
