-- The producer's items: one ready item of step 0 of job $1 per payload in $2, each of the
-- component at the same place in $3.
INSERT INTO work_items (job_id, step_index, payload, component)
SELECT $1, 0, p.payload, p.component
  FROM unnest($2::jsonb[], $3::text[]) WITH ORDINALITY AS p(payload, component, ordinality)
 ORDER BY p.ordinality;
