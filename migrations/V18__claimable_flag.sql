-- A claim moves its step's ready_count and last_worked. While either takes part in an index,
-- each claim rewrites every index entry of the step's user_work row (an update that is not
-- HOT). The fair order reads two facts from them, so those facts get columns of their own that
-- change only when the order's answer does:
--
-- * claimable: whether the step has ready items and is not paused, kept by PostgreSQL from
--   ready_count and paused. It changes only when the step empties or fills, pauses or resumes.
-- * order_worked: last_worked as the order between a user's steps reads it (least recently
--   worked first). That order matters only where the user has two or more claimable steps in
--   one queue and actor node; there a claim writes it with last_worked. The claims that take a
--   user's only claimable step of a queue (outside actors) leave it behind, and name the step
--   on the user's service_users row (lone_job_id, lone_step_index). When another step of the
--   queue becomes claimable, track_claimable_step brings the named step, and the new one, level
--   with their last_worked.
ALTER TABLE user_work
    ADD COLUMN claimable boolean GENERATED ALWAYS AS (ready_count > 0 AND NOT paused) STORED,
    ADD COLUMN order_worked timestamptz;

ALTER TABLE service_users
    ADD COLUMN lone_job_id uuid,
    ADD COLUMN lone_step_index integer;

UPDATE user_work SET order_worked = last_worked WHERE last_worked IS NOT NULL;

CREATE INDEX user_work_claimable_in_order
    ON user_work (service, component, tenant, username, actor, is_async, priority DESC,
                  order_worked NULLS FIRST, job_id, step_index)
    WHERE claimable;
DROP INDEX user_work_claimable;
ALTER INDEX user_work_claimable_in_order RENAME TO user_work_claimable;

-- Paused steps, which the metrics sum ready items over: no longer only those with ready items,
-- so that ready_count takes part in no index.
CREATE INDEX user_work_paused_steps ON user_work (service, tenant) WHERE paused;
DROP INDEX user_work_paused;
ALTER INDEX user_work_paused_steps RENAME TO user_work_paused;
