-- Deletes those of jobs $1 (finished, and locked by the caller) that have no items left,
-- with their steps, metadata and user_work rows, after remembering when those rows were last worked
-- (pruned_work), which the fair order's rows still say. Returns the deleted jobs. The emptied
-- jobs go to each table as an array, so that each deletes by its primary key rather than
-- joining a hundred jobs to a table it would read whole while that table is small.
WITH emptied AS (
    SELECT ARRAY(
               SELECT j.job_id
                 FROM jobs j
                WHERE j.job_id = ANY($1::uuid[])
                  AND NOT EXISTS (SELECT 1 FROM work_items wi WHERE wi.job_id = j.job_id)
           ) AS jobs
), remembered AS (
    INSERT INTO pruned_work (username, service, component, tenant, actor, last_worked)
    SELECT uw.username, uw.service, uw.component, uw.tenant, uw.actor, max(uw.last_worked)
      FROM user_work uw
     WHERE uw.job_id = ANY((SELECT jobs FROM emptied)::uuid[])
       AND uw.last_worked IS NOT NULL
     GROUP BY uw.username, uw.service, uw.component, uw.tenant, uw.actor
    ON CONFLICT (username, service, component, tenant, actor)
    DO UPDATE SET last_worked = greatest(pruned_work.last_worked, EXCLUDED.last_worked)
), counters AS (
    DELETE FROM user_work uw WHERE uw.job_id = ANY((SELECT jobs FROM emptied)::uuid[])
), steps AS (
    DELETE FROM job_steps s WHERE s.job_id = ANY((SELECT jobs FROM emptied)::uuid[])
), metadata AS (
    DELETE FROM job_metadata m WHERE m.job_id = ANY((SELECT jobs FROM emptied)::uuid[])
)
DELETE FROM jobs j
 WHERE j.job_id = ANY((SELECT jobs FROM emptied)::uuid[])
RETURNING j.job_id, j.username, j.tenant, j.status::text;
