-- take_turns: the turns a set of picks takes in one queue's users' order, one after another
-- as single claims would take them (turn_start): each pick's user's pass after it, and the
-- order's clock after them all. A user's later picks start from its pass after its earlier ones.
--
-- Arguments: the order's clock; per pick, in order: its user, and that user's pass, fresh flag
-- and weight as its queue row holds them before the set.
-- Answer: passes, per pick, the user's pass after it; clock, the clock after the last.

CREATE OR REPLACE FUNCTION take_turns(
    p_clock bigint,
    p_usernames text[],
    p_passes bigint[],
    p_fresh boolean[],
    p_weights integer[],
    OUT passes bigint[],
    OUT clock bigint
)
LANGUAGE plpgsql
IMMUTABLE
AS $turns$
DECLARE
    -- A user's state is kept at its first pick's index.
    v_user integer;
    v_pass bigint[] := p_passes;
    v_fresh boolean[] := p_fresh;
    v_start bigint;
BEGIN
    clock := p_clock;
    passes := '{}';
    FOR pick IN 1 .. coalesce(cardinality(p_usernames), 0) LOOP
        v_user := array_position(p_usernames, p_usernames[pick]);
        v_start := turn_start(v_pass[v_user], v_fresh[v_user], p_weights[pick], clock);
        v_pass[v_user] := v_start + stride_for_weight(p_weights[pick]);
        v_fresh[v_user] := false;
        passes[pick] := v_pass[v_user];
        clock := greatest(clock, v_start);
    END LOOP;
END;
$turns$;
