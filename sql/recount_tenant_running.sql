-- Brings the tenant rows' running counts back to a count of the running items, rows a claim or
-- an activation holds excepted. Described with the function, in
-- migrations/V5__exact_tenant_running_counts.sql.
SELECT recount_tenant_running();
