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
-- The rate limit is a bucket kept as one time, next_free (bucket_tokens tells how).
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
            v_by_rate := bucket_tokens(v_policy.rate_per_second, v_policy.burst,
                                       v_policy.next_free);
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
                    -- When the next item is due, once the bucket is billed for all it allows
                    -- this batch: at most one interval from now.
                    retry_ms := retry_ms_until(
                        bucket_due(v_policy.rate_per_second, v_policy.burst,
                                   bucket_charged(v_policy.rate_per_second, v_policy.next_free,
                                                  v_by_rate)));
                END IF;
            END IF;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END;
$admit$;
