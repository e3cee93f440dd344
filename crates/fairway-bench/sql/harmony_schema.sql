-- Harmony's user_work table, as its migrations define it, for the baseline claim paths. It is
-- seeded with the same jobs as the broker's own tables and shares their work_items.
CREATE TABLE harmony_user_work (
    id            serial PRIMARY KEY,
    job_id        uuid        NOT NULL,
    service_id    text        NOT NULL,
    username      text        NOT NULL,
    is_async      boolean     NOT NULL,
    ready_count   integer     NOT NULL DEFAULT 0,
    running_count integer     NOT NULL DEFAULT 0,
    last_worked   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, service_id)
);
CREATE INDEX harmony_user_work_service_id ON harmony_user_work (service_id);
CREATE INDEX harmony_user_work_username ON harmony_user_work (username);
CREATE INDEX harmony_user_work_last_worked ON harmony_user_work (last_worked);

-- The first id of the items added while paths run, so that a reset can remove them.
CREATE TABLE bench_seed (first_added_id bigint NOT NULL);
