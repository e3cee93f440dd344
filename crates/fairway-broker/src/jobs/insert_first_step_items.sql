-- The producer's items: one item of step 0 of job $1 per payload in $2, each of the component
-- at the same place in $3; ready, or scheduled until $4 when it is not NULL.
INSERT INTO work_items (job_id, step_index, payload, component, status, not_before)
SELECT $1, 0, p.payload, p.component,
       CASE WHEN $4::timestamptz IS NULL THEN 'ready' ELSE 'scheduled' END::work_item_status,
       $4
  FROM unnest($2::jsonb[], $3::text[]) WITH ORDINALITY AS p(payload, component, ordinality)
 ORDER BY p.ordinality;
