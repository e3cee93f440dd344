-- tenant_has_rivals: whether another tenant has an active queue in the same (service,
-- component). Only then is the tenant's running count kept exact (see tenant_queues).
--
-- Arguments: the service, component and tenant. Answer: true when a rival exists.
-- Locks: none; reads tenant_queues by its primary key, stopping at the first rival.

CREATE OR REPLACE FUNCTION tenant_has_rivals(p_service text, p_component text, p_tenant text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $rivals$
BEGIN
    -- A scalar subquery ordered like the primary key (EXISTS would drop the order), so that
    -- it is read from that index and stops at the first rival.
    RETURN (SELECT true
              FROM tenant_queues tq
             WHERE tq.service = p_service
               AND tq.component = p_component
               AND tq.tenant <> p_tenant
               AND tq.active
             ORDER BY tq.service, tq.component, tq.tenant
             LIMIT 1) IS NOT NULL;
END;
$rivals$;
