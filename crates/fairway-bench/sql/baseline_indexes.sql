-- The baselines' own indexes, created before their run and dropped after it, so that each path
-- is measured with the index its query needs and the others pay for none of them:
-- fifo's ready items in id order, and Harmony's ready items of a job step in id order (the
-- broker's own index has the item's component between the step and the id).
CREATE INDEX IF NOT EXISTS bench_fifo_ready ON work_items (id) WHERE status = 'ready';
CREATE INDEX IF NOT EXISTS bench_harmony_ready ON work_items (job_id, step_index, id)
    WHERE status = 'ready';
