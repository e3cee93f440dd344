-- One user_work row per step of job $1 of user $2: services $4 and aggregate flags $5, in order.
INSERT INTO user_work (job_id, step_index, username, service, is_async, aggregate)
SELECT $1, (s.ordinality - 1)::integer, $2, s.service, $3, s.aggregate
  FROM unnest($4::text[], $5::boolean[]) WITH ORDINALITY AS s(service, aggregate, ordinality);
