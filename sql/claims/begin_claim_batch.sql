-- begin_claim_batch: what a claim batch does before its first item, asked in one statement so
-- that a batch of services without a policy, with no user's bucket come due and no tenant's
-- change logged pays only that:
-- - the services' claim locks, in name order, waited for: a service's claims take turns, in
--   every broker, rather than race for the head of the same order;
-- - capped and rate-limited services, before anything else is locked: each request's max is
--   cut to what its service's policy still allows (admit_services);
-- - the tenants' running-count changes logged since the last batch (only tenants that compete
--   log them), folded, since the tenant order reads the counts (fold_tenant_running_changes);
-- - users whose rate limit's next item has come due, put back into the fair order: their queue
--   rows left it when their buckets emptied (claim_step_item).
--
-- Arguments: the batch's services, queriers and maxes, request i the i-th of each.
-- Answer: in_order, the requests in the order they are served: by (service, querier), so that
-- the membership check and the component list are made once per querier and service. When a
-- service policy applies (policed): maxes, each request's max as cut, and limited and retry_ms
-- why (as admit_services answers). held, the greatest (service, component, tenant) key of the
-- tenant rows folded, which the transaction holds from here on, or NULL.
-- Locks: the advisory claim locks; the policed services' service_policies rows; the folded
-- tenant_queues rows; the due users' users rows (SKIP LOCKED).

CREATE OR REPLACE FUNCTION begin_claim_batch(
    p_services text[],
    p_queriers text[],
    INOUT maxes integer[],
    OUT in_order integer[],
    OUT policed boolean,
    OUT limited text[],
    OUT retry_ms bigint[],
    OUT held text[]
)
LANGUAGE plpgsql
AS $batch$
DECLARE
    v_locked boolean;
    v_users_due boolean;
    v_logged boolean;
    v_admitted record;
BEGIN
    SELECT (SELECT count(*)
              FROM (SELECT pg_advisory_xact_lock(hashtextextended('fairway claims ' || s.service,
                                                                  0))
                      FROM (SELECT DISTINCT r.service
                              FROM unnest(p_services) AS r(service)) s
                     ORDER BY s.service) locked) IS NOT NULL,
           EXISTS (SELECT 1
                     FROM service_policies sp
                    WHERE sp.service = ANY (p_services)
                      AND (sp.max_running > 0 OR sp.rate_per_second > 0)),
           EXISTS (SELECT 1 FROM users u WHERE u.throttled_until <= now()),
           EXISTS (SELECT 1 FROM tenant_running_changes),
           ARRAY(SELECT r.i
                   FROM unnest(p_services, p_queriers) WITH ORDINALITY AS r(service, querier, i)
                  ORDER BY r.service, r.querier, r.i)
      INTO v_locked, policed, v_users_due, v_logged, in_order;
    IF policed THEN
        FOR v_admitted IN SELECT * FROM admit_services(p_services, maxes) LOOP
            maxes[v_admitted.request] := v_admitted.allowed;
            limited[v_admitted.request] := v_admitted.limited;
            retry_ms[v_admitted.request] := v_admitted.retry_ms;
        END LOOP;
    END IF;
    IF v_logged THEN
        SELECT ARRAY[f.service, f.component, f.tenant]
          INTO held
          FROM fold_tenant_running_changes() f
         WHERE f.tenant IS NOT NULL;
    END IF;
    IF v_users_due THEN
        WITH due AS (
            SELECT u.username
              FROM users u
             WHERE u.throttled_until <= now()
               FOR NO KEY UPDATE SKIP LOCKED
        ), released AS (
            UPDATE users u
               SET throttled_until = NULL
              FROM due
             WHERE u.username = due.username
        )
        UPDATE service_users su
           SET throttled = false
          FROM due
         WHERE su.username = due.username
           AND su.throttled;
    END IF;
END;
$batch$;
