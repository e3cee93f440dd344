-- service_running: how many items of a service are running now, counted from the items: the
-- count a cap is held to (admit_services) and operators read (service_policy.sql).
--
-- Arguments: the service. Answer: its running items.
-- Locks: none. Reads every running item once, through the leases index, and its step's row for
-- the service, so it costs a read per busy worker, not per item of the backlog.

CREATE OR REPLACE FUNCTION service_running(p_service text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $running$
    SELECT count(*)
      FROM work_items w
      JOIN user_work uw
        ON (uw.job_id, uw.step_index, uw.component) = (w.job_id, w.step_index, w.component)
     WHERE w.status = 'running'
       AND uw.service = p_service;
$running$;
