-- Creates the single item of job $1's aggregating step once every earlier step has finished
-- (nothing ready or running) and the step before it has results. Its inputs are all results of
-- that step's successful items, in item-id order. Returns the step index when it created one.
INSERT INTO work_items (job_id, step_index, inputs)
SELECT agg.job_id,
       agg.step_index,
       coalesce((
           SELECT jsonb_agg(r.result ORDER BY wi.id, r.ordinality)
             FROM work_items wi
            CROSS JOIN LATERAL jsonb_array_elements(wi.results) WITH ORDINALITY AS r(result, ordinality)
            WHERE wi.job_id = agg.job_id
              AND wi.step_index = agg.step_index - 1
              AND wi.status = 'successful'
       ), '[]'::jsonb)
  FROM user_work agg
 WHERE agg.job_id = $1
   AND agg.aggregate
   AND agg.step_index > 0
   AND agg.ready_count + agg.running_count + agg.successful_count
       + agg.failed_count + agg.canceled_count = 0
   AND NOT EXISTS (
           SELECT 1
             FROM user_work prior
            WHERE prior.job_id = agg.job_id
              AND prior.step_index < agg.step_index
              AND (prior.ready_count > 0 OR prior.running_count > 0)
       )
   AND EXISTS (
           SELECT 1
             FROM user_work prev
            WHERE prev.job_id = agg.job_id
              AND prev.step_index = agg.step_index - 1
              AND prev.successful_count > 0
       )
RETURNING step_index;
