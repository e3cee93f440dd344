-- fold_tenant_running_changes: applies the logged running-count changes
-- (tenant_running_changes) of every tenant queue no other transaction holds, so that a claim
-- batch orders tenants by exact counts. Queues another transaction holds keep their log rows
-- for a later batch: no change is dropped.
--
-- Answer: the greatest (service, component, tenant) key folded, or NULLs when nothing was;
-- the claim may then wait only for tenant rows that sort after it.
-- Locks: the folded tenant_queues rows, SKIP LOCKED, held to the caller's commit. Two
-- statements: the rows are locked first, so that the second, in a fresh snapshot, sums every
-- change logged for them, and deletes only those.

CREATE OR REPLACE FUNCTION fold_tenant_running_changes(
    OUT service text,
    OUT component text,
    OUT tenant text
)
LANGUAGE plpgsql
AS $fold$
#variable_conflict use_column
DECLARE
    v_services text[];
    v_components text[];
    v_tenants text[];
BEGIN
    SELECT array_agg(l.service ORDER BY l.service, l.component, l.tenant),
           array_agg(l.component ORDER BY l.service, l.component, l.tenant),
           array_agg(l.tenant ORDER BY l.service, l.component, l.tenant)
      INTO v_services, v_components, v_tenants
      -- A primary-key probe per logged change (the log is as short as the endings since the
      -- last batch); a row locked twice is listed twice.
      FROM tenant_running_changes c
     CROSS JOIN LATERAL (
           SELECT tq.service, tq.component, tq.tenant
             FROM tenant_queues tq
            WHERE (tq.service, tq.component, tq.tenant) = (c.service, c.component, c.tenant)
              FOR NO KEY UPDATE SKIP LOCKED
           ) l;
    IF v_services IS NULL THEN
        RETURN;
    END IF;
    WITH folded AS (
        DELETE FROM tenant_running_changes c
         USING (SELECT DISTINCT *
                  FROM unnest(v_services, v_components, v_tenants)
                       AS l(service, component, tenant)) l
         WHERE (c.service, c.component, c.tenant) = (l.service, l.component, l.tenant)
     RETURNING c.service, c.component, c.tenant, c.running
    ), sums AS (
        SELECT f.service, f.component, f.tenant, sum(f.running)::integer AS running
          FROM folded f
         GROUP BY f.service, f.component, f.tenant
    )
    UPDATE tenant_queues tq
       SET running_count = greatest(tq.running_count + s.running, 0)
      FROM sums s
     WHERE (tq.service, tq.component, tq.tenant) = (s.service, s.component, s.tenant);
    service := v_services[cardinality(v_services)];
    component := v_components[cardinality(v_components)];
    tenant := v_tenants[cardinality(v_tenants)];
END;
$fold$;
