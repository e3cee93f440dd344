-- Retires the locked tenant_queues rows $1/$2/$3 (services, components, tenants) that still
-- have nothing claimable, as seen by this statement's fresh snapshot.
UPDATE tenant_queues tq
   SET active = false
  FROM unnest($1::text[], $2::text[], $3::text[]) AS idle(service, component, tenant)
 WHERE (tq.service, tq.component, tq.tenant) = (idle.service, idle.component, idle.tenant)
   AND NOT EXISTS (
           SELECT 1
             FROM service_users su
            WHERE (su.service, su.component, su.tenant) = (tq.service, tq.component, tq.tenant)
              AND su.ready_count > 0
       );
