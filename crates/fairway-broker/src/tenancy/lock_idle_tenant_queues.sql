-- Active tenant_queues rows whose tenant has nothing claimable left, locked (rows a claim or a
-- submission holds are left for a later pass). The caller checks again in a fresh statement
-- (retire_tenant_queues.sql) before retiring them: see tenant_queues in the schema.
SELECT tq.service, tq.component, tq.tenant
  FROM tenant_queues tq
 WHERE tq.active
   AND NOT EXISTS (
           SELECT 1
             FROM service_users su
            WHERE (su.service, su.component, su.tenant) = (tq.service, tq.component, tq.tenant)
              AND su.ready_count > 0
       )
   FOR NO KEY UPDATE SKIP LOCKED;
