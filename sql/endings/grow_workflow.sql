-- grow_workflow: what an ending adds to its job's workflow, in the ending's transaction: the
-- next step's items from its results (one ready item per result, carrying that result as its
-- only input, its parent's payload, and the component its parent's results go on to), and an
-- aggregating step's single item once its inputs are all in (every earlier step finished,
-- the step before it with successful items, and no item of its own yet; its inputs are all
-- results of that step's successful items, in item-id order, and its component is where the
-- lowest one's results go). The new items' counters move (apply_step_deltas), and a service
-- whose user's work became claimable is woken.
--
-- Arguments: the ended item, its job and step; where its results go (NULL: its own component);
-- whether it fans out to the next step, and whether it may complete an aggregate's inputs.
-- Answer: how many items of the job are still open after the growth (NULL: nothing grew), and
-- each tenant queue the growth made claimable, as apply_tenant_deltas takes them (the caller
-- applies them last in its transaction).
-- Locks: the caller holds the job owner's users row; the new steps' counter rows.

CREATE OR REPLACE FUNCTION grow_workflow(
    p_id bigint,
    p_job uuid,
    p_step integer,
    p_results_component text,
    p_fans_out boolean,
    p_may_aggregate boolean,
    OUT job_open_items integer,
    OUT services text[],
    OUT components text[],
    OUT tenants text[]
)
LANGUAGE plpgsql
AS $grow$
DECLARE
    v_created integer;
    v_aggregate record;
    v_change record;
BEGIN
    services := '{}';
    components := '{}';
    tenants := '{}';
    IF p_fans_out AND p_results_component IS NOT NULL THEN
        PERFORM create_step_queues(p_job, p_step + 1, ARRAY[p_results_component]);
        WITH created AS (
            INSERT INTO work_items (job_id, step_index, payload, inputs, component)
            SELECT wi.job_id, wi.step_index + 1, wi.payload, jsonb_build_array(r.result),
                   coalesce(wi.next_component, wi.component)
              FROM work_items wi
             CROSS JOIN LATERAL jsonb_array_elements(wi.results)
                   WITH ORDINALITY AS r(result, ordinality)
             WHERE wi.id = p_id
               AND wi.step_index = p_step
             ORDER BY r.ordinality
         RETURNING 1
        )
        SELECT count(*)::integer INTO v_created FROM created;
        v_change := apply_step_deltas(p_job, p_step + 1, p_results_component, v_created,
                                      0, 0, 0, 0, 0, false);
        job_open_items := v_change.job_open_items;
        IF v_change.became_claimable THEN
            PERFORM pg_notify('fairway_work_ready', v_change.service);
            services := services || v_change.service;
            components := components || p_results_component;
            tenants := tenants || v_change.tenant;
        END IF;
    END IF;
    IF NOT p_may_aggregate THEN
        RETURN;
    END IF;
    SELECT agg.step_index,
           (SELECT coalesce(wi.next_component, wi.component)
              FROM work_items wi
             WHERE wi.job_id = agg.job_id
               AND wi.step_index = agg.step_index - 1
               AND wi.status = 'successful'
             ORDER BY wi.id
             LIMIT 1) AS component
      INTO v_aggregate
      FROM job_steps agg
     WHERE agg.job_id = p_job
       AND agg.aggregate
       AND agg.step_index > 0
       AND NOT EXISTS (
               SELECT 1
                 FROM user_work mine
                WHERE mine.job_id = agg.job_id
                  AND mine.step_index = agg.step_index
                  AND mine.ready_count + mine.scheduled_count + mine.running_count
                      + mine.successful_count + mine.failed_count + mine.canceled_count > 0)
       AND NOT EXISTS (
               SELECT 1
                 FROM user_work prior
                WHERE prior.job_id = agg.job_id
                  AND prior.step_index < agg.step_index
                  AND (prior.ready_count > 0 OR prior.scheduled_count > 0
                       OR prior.running_count > 0))
       AND EXISTS (
               SELECT 1
                 FROM user_work prev
                WHERE prev.job_id = agg.job_id
                  AND prev.step_index = agg.step_index - 1
                  AND prev.successful_count > 0)
     ORDER BY agg.step_index
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM create_step_queues(p_job, v_aggregate.step_index, ARRAY[v_aggregate.component]);
    INSERT INTO work_items (job_id, step_index, component, inputs)
    SELECT p_job, v_aggregate.step_index, v_aggregate.component,
           coalesce((SELECT jsonb_agg(r.result ORDER BY wi.id, r.ordinality)
                       FROM work_items wi
                      CROSS JOIN LATERAL jsonb_array_elements(wi.results)
                            WITH ORDINALITY AS r(result, ordinality)
                      WHERE wi.job_id = p_job
                        AND wi.step_index = v_aggregate.step_index - 1
                        AND wi.status = 'successful'),
                    '[]'::jsonb);
    v_change := apply_step_deltas(p_job, v_aggregate.step_index, v_aggregate.component, 1,
                                  0, 0, 0, 0, 0, false);
    job_open_items := v_change.job_open_items;
    IF v_change.became_claimable THEN
        PERFORM pg_notify('fairway_work_ready', v_change.service);
        services := services || v_change.service;
        components := components || v_aggregate.component;
        tenants := tenants || v_change.tenant;
    END IF;
END;
$grow$;
