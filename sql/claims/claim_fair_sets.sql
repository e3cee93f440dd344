-- claim_fair_sets: the sets of the order's head a run of claim_items' requests takes, one
-- after another (claim_fair_round), for as long as each set is exact and the requests want
-- more: the fair requests (no strategy) of one service and querier, where one tenant's queue
-- of one component is all the order holds. Single picks take over where a set stops.
--
-- Arguments: the service, querier and component; claim_items' request arrays (services,
-- queriers, strategies, maxes, workers, tokens), request i the i-th of each; the lease.
-- Answer: a row per item claimed, in the order served, with the request it went to.
-- Locks: claim_fair_round's, set by set.

CREATE OR REPLACE FUNCTION claim_fair_sets(
    p_service text,
    p_querier text,
    p_component text,
    p_services text[],
    p_queriers text[],
    p_strategies jsonb[],
    p_maxes integer[],
    p_workers integer[],
    p_tokens bigint[],
    p_lease_ms bigint
)
RETURNS TABLE (
    request integer,
    username text,
    tenant text,
    id bigint,
    job_id uuid,
    step_index integer,
    payload jsonb,
    inputs jsonb,
    attempt integer,
    lease_expires_at timestamptz,
    traceparent text
)
LANGUAGE plpgsql
AS $sets$
DECLARE
    v_served integer[] := array_fill(0, ARRAY[cardinality(p_services)]);
    -- The request of each item the run still wants, in the order they are served.
    v_slots integer[];
    v_set record;
    v_claimed integer;
    v_missed boolean;
BEGIN
    LOOP
        v_slots := ARRAY(SELECT r.i
                           FROM unnest(p_services, p_queriers, p_strategies)
                                WITH ORDINALITY AS r(service, querier, strategy, i)
                          CROSS JOIN LATERAL
                                generate_series(1, p_maxes[r.i] - v_served[r.i]) g
                          WHERE (r.service, r.querier) = (p_service, p_querier)
                            AND r.strategy IS NULL
                          ORDER BY r.i, g);
        EXIT WHEN cardinality(v_slots) = 0;
        v_claimed := 0;
        v_missed := false;
        FOR v_set IN
            SELECT *
              FROM claim_fair_round(p_service, p_querier, p_component, v_slots, p_workers,
                                    p_tokens, p_lease_ms)
        LOOP
            v_missed := v_missed OR v_set.id IS NULL;
            CONTINUE WHEN v_set.id IS NULL;
            v_served[v_set.request] := v_served[v_set.request] + 1;
            v_claimed := v_claimed + 1;
            request := v_set.request;
            username := v_set.username;
            tenant := v_set.tenant;
            id := v_set.id;
            job_id := v_set.job_id;
            step_index := v_set.step_index;
            payload := v_set.payload;
            inputs := v_set.inputs;
            attempt := v_set.attempt;
            lease_expires_at := v_set.lease_expires_at;
            traceparent := v_set.traceparent;
            RETURN NEXT;
        END LOOP;
        -- A set that took every item wanted leaves none to look for again; one that missed an
        -- item another transaction held, or took none, leaves the rest to single picks.
        EXIT WHEN v_claimed IN (0, cardinality(v_slots)) OR v_missed;
    END LOOP;
END;
$sets$;
