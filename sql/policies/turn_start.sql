-- turn_start: where a turn of a weighted level of the fair order starts, in its order's virtual
-- time (start-time fair queueing, docs/policy-design.md "Weights at any scale"). A turn moves the
-- row's pass on to its start plus its stride (stride_for_weight), and the order's clock up to
-- the start. The floor keeps a row from banking credit: a row back from having no ready work (or
-- never served) starts at the clock; one held up while backlogged, by its work in progress,
-- keeps at most one weight-1 stride less its own. With weight 1 the floor is the clock: the
-- turns then follow the least recently worked, as they did before weights had turns.
--
-- Arguments: the row's pass (NULL: never served) and fresh flag, its weight, the clock.
-- Answer: the turn's start.

CREATE OR REPLACE FUNCTION turn_start(
    p_pass bigint,
    p_fresh boolean,
    p_weight integer,
    p_clock bigint
)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $start$
    SELECT greatest(p_pass,
                    CASE WHEN p_fresh OR p_pass IS NULL THEN p_clock
                         ELSE p_clock - (1000000 - stride_for_weight(p_weight)) END);
$start$;
