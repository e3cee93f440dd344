-- Brings the tenant hint rows' running counts back to a count of the running items, which
-- only the leases index needs to find. Rows a claim or completion holds right now are skipped.
WITH actual AS (
    SELECT uw.service, uw.component, uw.tenant, count(*)::integer AS running
      FROM work_items wi
      JOIN user_work uw
        ON (uw.job_id, uw.step_index, uw.component) = (wi.job_id, wi.step_index, wi.component)
     WHERE wi.status = 'running'
     GROUP BY uw.service, uw.component, uw.tenant
), drifted AS (
    SELECT tq.service, tq.component, tq.tenant, coalesce(a.running, 0) AS running
      FROM tenant_queues tq
      LEFT JOIN actual a
        ON (a.service, a.component, a.tenant) = (tq.service, tq.component, tq.tenant)
     WHERE tq.running_count <> coalesce(a.running, 0)
       FOR NO KEY UPDATE OF tq SKIP LOCKED
)
UPDATE tenant_queues tq
   SET running_count = drifted.running
  FROM drifted
 WHERE (tq.service, tq.component, tq.tenant) = (drifted.service, drifted.component, drifted.tenant);
