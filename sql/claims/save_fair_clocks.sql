-- save_fair_clocks: writes the clocks a claim batch moved on (carry_fair_clock), each row once.
-- The batch holds its services' claim locks, so no other claim moves these clocks meanwhile;
-- greatest() keeps a clock from going back all the same.
--
-- Arguments: the batch's clocks.
-- Answer: none.
-- Locks: the fair_clocks rows written.

CREATE OR REPLACE FUNCTION save_fair_clocks(p_clocks jsonb)
RETURNS void
LANGUAGE plpgsql
-- PL/pgSQL, not SQL: a SQL function that writes a table is planned afresh on every call.
AS $save$
BEGIN
    INSERT INTO fair_clocks AS fc (service, component, tenant, clock)
    SELECT o.key ->> 0, o.key ->> 1, o.key ->> 2, o.clock
      FROM (SELECT e.key::jsonb AS key, e.value::bigint AS clock
              FROM jsonb_each_text(p_clocks) e) o
     ORDER BY 1, 2, 3
        ON CONFLICT (service, component, tenant) DO UPDATE
       SET clock = greatest(fc.clock, excluded.clock);
END;
$save$;
