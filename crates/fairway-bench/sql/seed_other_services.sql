-- Gives every seeded user one more job in each of the services bench-2 … bench-$1, of $2 ready
-- items each, which no path claims: ready work elsewhere, whose place in those services' fair
-- orders a claim must keep. Counters come after, from the items (seed_counters.sql).
WITH owners AS (
    SELECT DISTINCT ON (j.username) j.username, j.tenant
      FROM jobs j
     ORDER BY j.username, j.job_id
), other_jobs AS (
    SELECT gen_random_uuid() AS job_id, o.username, o.tenant, 'bench-' || n AS service
      FROM owners o
     CROSS JOIN generate_series(2, $1::integer) AS n
), new_jobs AS (
    INSERT INTO jobs (job_id, username, is_async, tenant, actor)
    SELECT job_id, username, true, tenant, '{}' FROM other_jobs
), new_steps AS (
    INSERT INTO job_steps (job_id, step_index, service, aggregate)
    SELECT job_id, 0, service, false FROM other_jobs
), new_work AS (
    INSERT INTO user_work (job_id, step_index, component, username, service, is_async, tenant,
                           actor)
    SELECT job_id, 0, 'unknown', username, service, true, tenant, '{}' FROM other_jobs
), new_queues AS (
    INSERT INTO service_users (service, component, tenant, username)
    SELECT service, 'unknown', tenant, username FROM other_jobs
)
INSERT INTO work_items (job_id, step_index, component)
SELECT job_id, 0, 'unknown'
  FROM other_jobs
 CROSS JOIN generate_series(1, $2::integer);
