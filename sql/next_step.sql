-- Whether job $1 has a step after step $2, and whether that step aggregates.
SELECT aggregate FROM user_work WHERE job_id = $1 AND step_index = $2 + 1;
