-- Fan-out: one ready item of step $2 + 1 per result of work item $1, carrying that result as
-- its only input, its parent's payload, and the component its parent's results go on to.
-- Returns how many were created.
WITH created AS (
    INSERT INTO work_items (job_id, step_index, payload, inputs, component)
    SELECT wi.job_id, wi.step_index + 1, wi.payload, jsonb_build_array(r.result),
           coalesce(wi.next_component, wi.component)
      FROM work_items wi
     CROSS JOIN LATERAL jsonb_array_elements(wi.results) WITH ORDINALITY AS r(result, ordinality)
     WHERE wi.id = $1
       AND wi.step_index = $2
     ORDER BY r.ordinality
 RETURNING 1
)
SELECT count(*)::integer FROM created;
