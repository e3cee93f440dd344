-- Reading a job's results, items and a user's or tenant's jobs by cursor, and pruning finished
-- jobs. Schema only: the statements are in sql/.

-- A job's items of one status in one step, in id order: the results of its last step (status
-- successful), its errors (failed) and its items filtered by step and status are each a range
-- of this index, and the unfiltered listing merges a range per step and status, so that a page
-- reads about as many entries as it returns, however big the job. The pruner finds a job's
-- items here too.
CREATE INDEX work_items_by_job_status ON work_items (job_id, status, step_index, id);

-- A user's or a tenant's jobs of one status, newest first: one range per status, merged when
-- the listing names none. They replace the baseline's jobs_by_user, a prefix of the first.
CREATE INDEX jobs_by_user_status ON jobs (username, status, created_at, job_id);
CREATE INDEX jobs_by_tenant_status ON jobs (tenant, status, created_at, job_id);
DROP INDEX jobs_by_user;

-- Finished jobs, oldest first, for the pruner. A finished job's row is never written again, so
-- its updated_at is when it finished.
CREATE INDEX jobs_finished ON jobs (updated_at, job_id)
    WHERE status IN ('successful', 'complete_with_errors', 'failed', 'canceled');

-- When each (user, service, component, tenant, actor path) was last worked, as the user_work
-- rows the pruner deleted knew it. The fair order's rows keep their last_worked after their
-- jobs are pruned, and the consistency check recounts it from user_work and these rows
-- together. Only the pruner writes here, one at a time.
CREATE TABLE pruned_work (
    username    text        NOT NULL,
    service     text        NOT NULL,
    component   text        NOT NULL,
    tenant      text        NOT NULL,
    actor       text[]      NOT NULL,
    last_worked timestamptz NOT NULL,
    PRIMARY KEY (username, service, component, tenant, actor)
);
