-- tenant_running: how many items of a tenant are running now, over every service, counted from
-- the items: the count a tenant's cap is held to (admit_tenant) and operators read. The tenant
-- queues' running counts cannot serve: they are kept only where tenants compete.
--
-- Arguments: the tenant. Answer: its running items.
-- Locks: none. Reads every running item once, through the leases index, and its step's row, so
-- it costs a read per busy worker, not per item of the backlog.

CREATE OR REPLACE FUNCTION tenant_running(p_tenant text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $running$
    SELECT count(*)
      FROM work_items w
      JOIN user_work uw
        ON (uw.job_id, uw.step_index, uw.component) = (w.job_id, w.step_index, w.component)
     WHERE w.status = 'running'
       AND uw.tenant = p_tenant;
$running$;
