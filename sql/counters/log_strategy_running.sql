-- log_strategy_running: logs a change of a job step's running count into
-- strategy_running_changes, once per metadata key and value of the step's job, so that the
-- running counts per (service, key, value) that prefer_distinct and max_simultaneous read
-- move with every claim, ending, expiry and cancel, without a row lock (the log takes inserts
-- side by side). No notification: one per ending would serialise every commit on the
-- notification queue's lock; capped long polls look again on a short period instead. The
-- binding fires only for steps of jobs with metadata, and follows the function, since it can
-- only be made once the function exists.
--
-- Why a trigger, not a statement the broker calls: running_count moves in claims, endings,
-- the reaper and cancels, inside other server functions; a change the log missed would move a
-- cap's count away from the running items for good. The trigger sees every change of the
-- count, whoever makes it.
--
-- Locks: none beyond the log's inserts.

CREATE OR REPLACE FUNCTION log_strategy_running()
RETURNS trigger
LANGUAGE plpgsql
AS $log$
BEGIN
    INSERT INTO strategy_running_changes (service, key, value, running)
    SELECT NEW.service, m.key, m.value, NEW.running_count - OLD.running_count
      FROM job_metadata m
     WHERE m.job_id = NEW.job_id;
    RETURN NULL;
END;
$log$;

CREATE OR REPLACE TRIGGER user_work_strategy_running
    AFTER UPDATE OF running_count ON user_work
    FOR EACH ROW
    WHEN (NEW.has_metadata AND NEW.running_count <> OLD.running_count)
    EXECUTE FUNCTION log_strategy_running();
