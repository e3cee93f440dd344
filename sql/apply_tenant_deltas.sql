-- A transaction's tenant_queues changes, last and in key order: services $1, components $2,
-- tenants $3, running deltas $4, activations $5. See sql/functions/apply_tenant_deltas.sql.
SELECT apply_tenant_deltas($1, $2, $3, $4, $5);
