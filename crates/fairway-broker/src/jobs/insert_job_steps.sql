-- The steps of job $1: services $2 and aggregate flags $3, in order.
INSERT INTO job_steps (job_id, step_index, service, aggregate)
SELECT $1, (s.ordinality - 1)::integer, s.service, s.aggregate
  FROM unnest($2::text[], $3::boolean[]) WITH ORDINALITY AS s(service, aggregate, ordinality);
