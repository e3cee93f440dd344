-- track_claimable_step: keeps claimable_steps (and claimable_step_metadata for jobs with
-- metadata) holding exactly the user_work rows with ready items that are not paused, with
-- the order keys the strategies read: the job's submission order and priority, and a hash of
-- the step's key, fixed for the step's life, for `random`. A step that becomes claimable also
-- brings its order column (order_worked) level with last_worked, and that of the step its
-- queue's service_users row names as claimed alone: claims of a user's only claimable step
-- leave the column behind, and from two steps on the order between them reads it. The binding
-- fires only when a row's claimability changes, so the claims and endings that keep a step
-- claimable pay nothing but the WHEN test. The binding follows the function, since it can only
-- be made once the function exists.
--
-- Why a trigger, not a statement the broker calls: ready_count and paused move in claims,
-- every ending, cancels, pauses, resumes, retries, the promoter and the reaper, most of them
-- inside other server functions. A transition one of them missed would leave a step listed
-- with nothing ready, or unlisted with work ready, and nothing would repair it; the trigger
-- sees every write of the row, whoever makes it.
--
-- Locks: the step's claimable rows, which only transactions holding the step's user_work row
-- (so its owner's users row) write, the owner's users row, and the user_work row of the
-- owner's lone step.

CREATE OR REPLACE FUNCTION track_claimable_step()
RETURNS trigger
LANGUAGE plpgsql
AS $track$
BEGIN
    IF NEW.claimable THEN
        -- Recorded on the owner's users row, which this transaction holds already: a set that
        -- read the user's steps before this commits, and locks the user after, sees another
        -- transaction there and so knows the steps it read may be out of date
        -- (claim_fair_round). Once per transaction: each rewrite of the row in one transaction
        -- lengthens the chain of versions every later read of it walks.
        UPDATE users u
           SET step_made_claimable_by = pg_current_xact_id()
         WHERE u.username = NEW.username
           AND u.step_made_claimable_by IS DISTINCT FROM pg_current_xact_id();
        UPDATE user_work uw
           SET order_worked = uw.last_worked
          FROM (SELECT NEW.job_id, NEW.step_index
                UNION ALL
                SELECT su.lone_job_id, su.lone_step_index
                  FROM service_users su
                 WHERE (su.service, su.component, su.tenant, su.username)
                       = (NEW.service, NEW.component, NEW.tenant, NEW.username)
                   AND NEW.actor = '{}') level(job_id, step_index)
         WHERE (uw.job_id, uw.step_index, uw.component)
               = (level.job_id, level.step_index, NEW.component)
           -- Not limited to claimable steps: that condition would let the planner read the
           -- claimable index in place of two key probes, and where a transaction makes many
           -- steps claimable its statistics still say that index is small. A named step that
           -- is no longer claimable is brought level harmlessly.
           AND uw.order_worked IS DISTINCT FROM uw.last_worked;
        INSERT INTO claimable_steps (job_id, step_index, component, service, tenant, username,
                                     seq, priority, shuffle)
        SELECT NEW.job_id, NEW.step_index, NEW.component, NEW.service, NEW.tenant,
               NEW.username, j.seq, j.priority,
               hashtext(NEW.job_id::text || '/' || NEW.step_index || '/' || NEW.component)
          FROM jobs j
         WHERE j.job_id = NEW.job_id
            ON CONFLICT DO NOTHING;
        IF NEW.has_metadata THEN
            INSERT INTO claimable_step_metadata (service, key, value, job_id, step_index,
                                                 component, seq, priority, shuffle)
            SELECT cs.service, m.key, m.value, cs.job_id, cs.step_index, cs.component, cs.seq,
                   cs.priority, cs.shuffle
              FROM claimable_steps cs
              JOIN job_metadata m ON m.job_id = cs.job_id
             WHERE (cs.job_id, cs.step_index, cs.component)
                   = (NEW.job_id, NEW.step_index, NEW.component)
                ON CONFLICT DO NOTHING;
        END IF;
    ELSE
        DELETE FROM claimable_steps cs
         WHERE (cs.job_id, cs.step_index, cs.component)
               = (NEW.job_id, NEW.step_index, NEW.component);
        IF NEW.has_metadata THEN
            DELETE FROM claimable_step_metadata cm
             WHERE (cm.job_id, cm.step_index, cm.component)
                   = (NEW.job_id, NEW.step_index, NEW.component);
        END IF;
    END IF;
    RETURN NULL;
END;
$track$;

CREATE OR REPLACE TRIGGER user_work_claimability
    AFTER UPDATE OF ready_count, paused ON user_work
    FOR EACH ROW
    WHEN (OLD.claimable IS DISTINCT FROM NEW.claimable)
    EXECUTE FUNCTION track_claimable_step();
