-- The steps of each of jobs $1 with their item counts summed over components, by job and step.
-- Per job, from its own rows: a LATERAL probe rather than a join, which could read every step
-- of every job once the page of jobs is big.
SELECT steps.*
  FROM unnest($1::uuid[]) WITH ORDINALITY AS job(id, position)
 CROSS JOIN LATERAL (
       SELECT s.job_id,
              s.step_index,
              s.service,
              s.aggregate,
              coalesce(array_agg(uw.component ORDER BY uw.component)
                           FILTER (WHERE uw.component IS NOT NULL), '{}') AS components,
              coalesce(sum(uw.ready_count), 0)::integer AS ready_count,
              coalesce(sum(uw.scheduled_count), 0)::integer AS scheduled_count,
              coalesce(sum(uw.running_count), 0)::integer AS running_count,
              coalesce(sum(uw.successful_count), 0)::integer AS successful_count,
              coalesce(sum(uw.failed_count), 0)::integer AS failed_count,
              coalesce(sum(uw.canceled_count), 0)::integer AS canceled_count
         FROM job_steps s
         LEFT JOIN user_work uw ON uw.job_id = s.job_id AND uw.step_index = s.step_index
        WHERE s.job_id = job.id
        GROUP BY s.job_id, s.step_index, s.service, s.aggregate
       ) steps
 ORDER BY job.position, steps.step_index;
