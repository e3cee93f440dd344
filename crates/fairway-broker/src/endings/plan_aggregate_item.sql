-- Whether job $1's aggregating step is due its single item: every earlier step has finished
-- (nothing ready, scheduled or running), the step before it has successful items, and it has no item yet.
-- Returns the step and the item's component: where the lowest successful input's results go.
SELECT agg.step_index,
       (SELECT coalesce(wi.next_component, wi.component)
          FROM work_items wi
         WHERE wi.job_id = agg.job_id
           AND wi.step_index = agg.step_index - 1
           AND wi.status = 'successful'
         ORDER BY wi.id
         LIMIT 1) AS component
  FROM job_steps agg
 WHERE agg.job_id = $1
   AND agg.aggregate
   AND agg.step_index > 0
   AND NOT EXISTS (
           SELECT 1
             FROM user_work mine
            WHERE mine.job_id = agg.job_id
              AND mine.step_index = agg.step_index
              AND mine.ready_count + mine.scheduled_count + mine.running_count
                  + mine.successful_count
                  + mine.failed_count + mine.canceled_count > 0
       )
   AND NOT EXISTS (
           SELECT 1
             FROM user_work prior
            WHERE prior.job_id = agg.job_id
              AND prior.step_index < agg.step_index
              AND (prior.ready_count > 0 OR prior.scheduled_count > 0 OR prior.running_count > 0)
       )
   AND EXISTS (
           SELECT 1
             FROM user_work prev
            WHERE prev.job_id = agg.job_id
              AND prev.step_index = agg.step_index - 1
              AND prev.successful_count > 0
       )
 ORDER BY agg.step_index
 LIMIT 1;
