-- The producer's items: one ready item of step 0 of job $1 per payload in $2.
INSERT INTO work_items (job_id, step_index, payload)
SELECT $1, 0, p.payload
  FROM unnest($2::jsonb[]) WITH ORDINALITY AS p(payload, ordinality)
 ORDER BY p.ordinality;
