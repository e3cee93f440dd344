-- apply_tenant_delta: one tenant queue's change. p_activate (re)activates the queue, under
-- its row lock, because a user's work there became claimable, so that the reaper cannot
-- retire it meanwhile; it also applies p_running to the row at once. Otherwise a running
-- change is logged in tenant_running_changes, which takes no row lock, and only while other
-- tenants compete for the component.
--
-- Arguments: service, component, tenant, the running-count change, whether to activate.
-- Answer: none.
-- Locks: the tenant_queues row when activating. Callers reach it through
-- apply_tenant_deltas, last in their transaction and in key order.

CREATE OR REPLACE FUNCTION apply_tenant_delta(
    p_service text,
    p_component text,
    p_tenant text,
    p_running integer,
    p_activate boolean
)
RETURNS void
LANGUAGE plpgsql
AS $tenant$
BEGIN
    IF p_activate THEN
        -- A new queue copies its tenant's weight and tier, as PUT /admin/tenants keeps the
        -- copies. A queue (re)activated is fresh: its next turn starts at the clock.
        INSERT INTO tenant_queues AS tq (service, component, tenant, running_count, weight,
                                         tier)
        SELECT p_service, p_component, p_tenant, greatest(p_running, 0), t.weight, t.tier
          FROM tenants t
         WHERE t.tenant = p_tenant
            ON CONFLICT (service, component, tenant) DO UPDATE
           SET active = true,
               fresh = tq.fresh OR NOT tq.active,
               running_count = greatest(tq.running_count + p_running, 0);
        RETURN;
    END IF;
    -- Kept while other tenants compete for the component; a tenant alone there needs no
    -- order, and the reaper recounts its row.
    IF p_running <> 0 AND tenant_has_rivals(p_service, p_component, p_tenant) THEN
        INSERT INTO tenant_running_changes (service, component, tenant, running)
        VALUES (p_service, p_component, p_tenant, p_running);
    END IF;
END;
$tenant$;
