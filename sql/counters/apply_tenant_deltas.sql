-- apply_tenant_deltas: the tenant side of a transaction's step count changes. Entries
-- (p_services[i], p_components[i], p_tenants[i], p_running[i], p_activate[i]) for the same
-- queue are summed, then applied one queue at a time by apply_tenant_delta.
--
-- Answer: none.
-- Locks: tenant_queues rows, last in the caller's transaction and in key order, so that two
-- transactions never hold one tenant's row while waiting for another's.

CREATE OR REPLACE FUNCTION apply_tenant_deltas(
    p_services text[],
    p_components text[],
    p_tenants text[],
    p_running integer[],
    p_activate boolean[]
)
RETURNS void
LANGUAGE plpgsql
AS $tenants$
DECLARE
    v_change record;
BEGIN
    FOR v_change IN
        SELECT d.service, d.component, d.tenant, sum(d.running)::integer AS running,
               bool_or(d.activate) AS activate
          FROM unnest(p_services, p_components, p_tenants, p_running, p_activate)
               AS d(service, component, tenant, running, activate)
         GROUP BY d.service, d.component, d.tenant
         ORDER BY d.service, d.component, d.tenant
    LOOP
        PERFORM apply_tenant_delta(v_change.service, v_change.component, v_change.tenant,
                                   v_change.running, v_change.activate);
    END LOOP;
END;
$tenants$;
