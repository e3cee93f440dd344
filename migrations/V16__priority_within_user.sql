-- Within a user's work, a job's priority orders its steps after sync before async and before
-- the least recently worked, as the fair order's job level reads them. Each step carries its
-- job's priority, fixed at submission, so that the level stays one read of an index's head.
ALTER TABLE user_work ADD COLUMN priority integer NOT NULL DEFAULT 0;

UPDATE user_work uw
   SET priority = j.priority
  FROM jobs j
 WHERE j.job_id = uw.job_id
   AND j.priority <> 0;

CREATE INDEX user_work_claimable_by_priority
    ON user_work (service, component, tenant, username, actor, is_async, priority DESC,
                  last_worked NULLS FIRST, job_id, step_index)
    WHERE ready_count > 0 AND NOT paused;
DROP INDEX user_work_claimable;
ALTER INDEX user_work_claimable_by_priority RENAME TO user_work_claimable;
