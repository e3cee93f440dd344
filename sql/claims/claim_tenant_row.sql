-- claim_tenant_row: the tenant's part in one item's claim, once claim_items has chosen the user
-- (and so the tenant). Two questions, in the lock order claims keep:
-- - A tenant with a cap or a rate limit: one more item must fit both, under the tenant's row
--   lock (admit_tenant). Else the tenant is passed over for the rest of the batch, its other
--   users with it.
-- - The tenant's queue row, kept exact while other tenants compete for the component, is
--   written after the item, and waited for then only when its key sorts after every tenant row
--   the transaction holds, the order everyone takes them in, so that waits cannot form a cycle.
--   Otherwise it is locked now without waiting; if another transaction (another broker's
--   claims) holds it, the tenant is passed over for the rest of the batch, as a held user is.
--
-- Arguments: the service, component and tenant; whether the tenant has a cap or a rate limit;
-- the components and whether tenants compete for each, as list_components read them (a
-- component a strategy found that the list does not have is asked afresh); the greatest
-- (service, component, tenant) key of the tenant rows the transaction holds.
-- Answer: passed when the tenant must be passed over, with limited ('cap', 'rate') and
-- retry_ms when its policy is why; else counted, whether its tenant_queues row takes the claim.
-- Locks: the tenants row of a policed tenant, and the tenant_queues row sorting before the held
-- key (both FOR NO KEY UPDATE SKIP LOCKED).

CREATE OR REPLACE FUNCTION claim_tenant_row(
    p_service text,
    p_component text,
    p_tenant text,
    p_policed boolean,
    p_components text[],
    p_contested boolean[],
    p_held text[],
    OUT passed boolean,
    OUT counted boolean,
    OUT limited text,
    OUT retry_ms bigint
)
LANGUAGE plpgsql
AS $tenant$
DECLARE
    v_admitted record;
BEGIN
    passed := false;
    IF p_policed THEN
        v_admitted := admit_tenant(p_tenant);
        IF v_admitted.limited IS NOT NULL THEN
            passed := true;
            IF v_admitted.limited <> 'held' THEN
                limited := v_admitted.limited;
                retry_ms := v_admitted.retry_ms;
            END IF;
            RETURN;
        END IF;
    END IF;
    counted := coalesce(p_contested[array_position(p_components, p_component)],
                        tenant_has_rivals(p_service, p_component, p_tenant));
    IF counted AND ARRAY[p_service, p_component, p_tenant] < p_held THEN
        PERFORM 1
           FROM tenant_queues tq
          WHERE (tq.service, tq.component, tq.tenant) = (p_service, p_component, p_tenant)
            FOR NO KEY UPDATE SKIP LOCKED;
        passed := NOT FOUND;
    END IF;
END;
$tenant$;
