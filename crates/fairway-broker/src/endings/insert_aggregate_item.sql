-- The single item of job $1's aggregating step $2, of component $3 (plan_aggregate_item.sql
-- said it is due). Its inputs are all results of the previous step's successful items, in
-- item-id order.
INSERT INTO work_items (job_id, step_index, component, inputs)
SELECT $1,
       $2,
       $3,
       coalesce((
           SELECT jsonb_agg(r.result ORDER BY wi.id, r.ordinality)
             FROM work_items wi
            CROSS JOIN LATERAL jsonb_array_elements(wi.results) WITH ORDINALITY AS r(result, ordinality)
            WHERE wi.job_id = $1
              AND wi.step_index = $2 - 1
              AND wi.status = 'successful'
       ), '[]'::jsonb);
