-- admit_services: how many items each request of a claim batch may take under its service's
-- policy (service_policies): no more than the cap leaves of max_running, and no more than the
-- rate limit's bucket holds. claim_items calls it first and cuts each request's max to it;
-- charge_services then bills the bucket for the items handed out.
--
-- The cap counts the service's running items from the items themselves (service_running),
-- under the policy's row lock: every claim of a capped or limited service holds that row until
-- it commits, so the claims of all brokers take turns and none sees a count another is about to
-- raise. An ending lowers the count without the lock; one not yet committed is still counted,
-- which errs on the side of the cap. The count reads every running item once (the leases
-- index), a cost only a capped service's claims pay.
--
-- The bucket is one time, next_free, by the generic cell rate algorithm: with the emission
-- interval T = 1 / rate_per_second rounded up to a microsecond, an item is due while next_free
-- (or now, if later) is at most (burst − 1) × T ahead of now, and each item moves it on by T.
-- So in any t seconds at most burst + rate_per_second × t items go out, whichever brokers
-- claim them; the rounding only ever lowers the rate.
--
-- Arguments: the batch's services and maxes, request i the i-th of each.
-- Answer: one row per request of a service with a cap or a limit: the items it may take
-- (allowed), and when that is fewer than it asked for, why (limited: 'cap' or 'rate') and, for
-- a rate, in how many milliseconds the next item is due (retry_ms).
-- Locks: the batch's service_policies rows with a cap or a limit, in service order (FOR
-- UPDATE), before anything else the claim locks, so that claims cannot wait in a cycle.

CREATE OR REPLACE FUNCTION admit_services(p_services text[], p_maxes integer[])
RETURNS TABLE (request integer, allowed integer, limited text, retry_ms bigint)
LANGUAGE plpgsql
AS $admit$
#variable_conflict use_column
DECLARE
    v_policy record;
    v_by_cap bigint;
    v_by_rate bigint;
    v_interval_us bigint;
    v_ahead_us bigint;
    v_left bigint;
    v_request record;
BEGIN
    FOR v_policy IN
        SELECT sp.*
          FROM service_policies sp
         WHERE sp.service = ANY (p_services)
           AND (sp.max_running > 0 OR sp.rate_per_second > 0)
         ORDER BY sp.service
           FOR UPDATE
    LOOP
        v_by_cap := NULL;
        v_by_rate := NULL;
        IF v_policy.max_running > 0 THEN
            v_by_cap := greatest(v_policy.max_running - service_running(v_policy.service), 0);
        END IF;
        IF v_policy.rate_per_second > 0 THEN
            v_interval_us := ceil(1000000 / v_policy.rate_per_second)::bigint;
            -- How far the next free slot lies ahead of now, in microseconds (0: due now).
            v_ahead_us := greatest(
                floor(extract(epoch FROM coalesce(v_policy.next_free, now()) - now())
                      * 1000000)::bigint,
                0);
            v_by_rate := CASE
                WHEN v_ahead_us > (v_policy.burst - 1) * v_interval_us THEN 0
                ELSE ((v_policy.burst - 1) * v_interval_us - v_ahead_us) / v_interval_us + 1
            END;
        END IF;
        v_left := least(coalesce(v_by_cap, v_by_rate), coalesce(v_by_rate, v_by_cap));
        FOR v_request IN
            SELECT r.i, r.max
              FROM unnest(p_services, p_maxes) WITH ORDINALITY AS r(service, max, i)
             WHERE r.service = v_policy.service
             ORDER BY r.i
        LOOP
            request := v_request.i;
            allowed := least(v_request.max, v_left);
            v_left := v_left - allowed;
            limited := NULL;
            retry_ms := NULL;
            IF allowed < v_request.max THEN
                IF v_by_cap IS NOT NULL AND (v_by_rate IS NULL OR v_by_cap <= v_by_rate) THEN
                    limited := 'cap';
                ELSE
                    limited := 'rate';
                    -- The next item is due once next_free, moved on by all the bucket
                    -- allows this batch, is within (burst − 1) intervals of now: at most one
                    -- interval from now.
                    retry_ms := greatest(
                        ceil((v_ahead_us + (v_by_rate - v_policy.burst + 1) * v_interval_us)
                             / 1000.0)::bigint,
                        1);
                END IF;
            END IF;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END;
$admit$;
