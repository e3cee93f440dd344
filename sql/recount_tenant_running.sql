-- Brings the tenant rows' running counts back to a count of the running items, rows a claim or
-- an activation holds excepted. See sql/functions/recount_tenant_running.sql.
SELECT recount_tenant_running();
