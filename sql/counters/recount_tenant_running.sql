-- recount_tenant_running: the reaper's recount of tenant_queues.running_count from the
-- leases, for the rows whose count plus logged changes disagree with their running items
-- (a tenant alone in its component is not kept exact, so this is how its row catches up).
--
-- Arguments: none. Answer: none.
-- Locks: the drifted tenant_queues rows, SKIP LOCKED (a row a claim or activation holds waits
-- for a later pass). Then, in a fresh snapshot, each locked row takes its running count and
-- its logged changes are dropped, both read in that one snapshot: a claim or ending that
-- commits later is neither counted nor dropped.

CREATE OR REPLACE FUNCTION recount_tenant_running()
RETURNS void
LANGUAGE plpgsql
AS $recount$
DECLARE
    v_services text[];
    v_components text[];
    v_tenants text[];
BEGIN
    WITH logged AS (
        SELECT c.service, c.component, c.tenant, sum(c.running)::integer AS running
          FROM tenant_running_changes c
         GROUP BY c.service, c.component, c.tenant
    )
    SELECT array_agg(l.service), array_agg(l.component), array_agg(l.tenant)
      INTO v_services, v_components, v_tenants
      FROM (SELECT tq.service, tq.component, tq.tenant
              FROM tenant_queues tq
              LEFT JOIN tenant_queue_running_items a
                ON (a.service, a.component, a.tenant) = (tq.service, tq.component, tq.tenant)
              LEFT JOIN logged g
                ON (g.service, g.component, g.tenant) = (tq.service, tq.component, tq.tenant)
             WHERE tq.running_count + coalesce(g.running, 0) <> coalesce(a.running, 0)
               FOR NO KEY UPDATE OF tq SKIP LOCKED) l;
    IF v_services IS NULL THEN
        RETURN;
    END IF;
    WITH locked AS (
        SELECT l.service, l.component, l.tenant
          FROM unnest(v_services, v_components, v_tenants) AS l(service, component, tenant)
    ), dropped AS (
        DELETE FROM tenant_running_changes c
         USING locked l
         WHERE (c.service, c.component, c.tenant) = (l.service, l.component, l.tenant)
    )
    UPDATE tenant_queues tq
       SET running_count = coalesce(a.running, 0)
      FROM locked l
      LEFT JOIN tenant_queue_running_items a
        ON (a.service, a.component, a.tenant) = (l.service, l.component, l.tenant)
     WHERE (tq.service, tq.component, tq.tenant) = (l.service, l.component, l.tenant);
END;
$recount$;
