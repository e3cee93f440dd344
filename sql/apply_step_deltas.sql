-- Moves the item counts of job $1's step $2 by the deltas $3 ready, $4 running, $5 successful,
-- $6 failed, $7 canceled, and keeps the user's users and service_users rows in step, in the
-- transaction that moved the items. The caller holds the user's users row. Returns the step's
-- service; whether the user's claimable work for it went from none to some (only then can a
-- worker of the service be waiting, so only then is a notification worth its commit-time lock);
-- and how many items of the whole job are still ready or running.
WITH step AS (
    UPDATE user_work
       SET ready_count = ready_count + $3,
           running_count = running_count + $4,
           successful_count = successful_count + $5,
           failed_count = failed_count + $6,
           canceled_count = canceled_count + $7
     WHERE job_id = $1
       AND step_index = $2
 RETURNING username, service, paused, ready_count, running_count
), user_counts AS (
    UPDATE users u
       SET running_count = u.running_count + $4
      FROM step
     WHERE u.username = step.username
       AND $4 <> 0
 RETURNING u.username, u.running_count
), queue_counts AS (
    UPDATE service_users su
       SET running_count = coalesce(uc.running_count, su.running_count),
           ready_count = su.ready_count
               + CASE WHEN su.service = step.service AND NOT step.paused THEN $3 ELSE 0 END
      FROM step
      LEFT JOIN user_counts uc ON true
     WHERE su.username = step.username
       AND (uc.username IS NOT NULL OR (su.service = step.service AND NOT step.paused AND $3 <> 0))
 RETURNING su.service, su.ready_count
)
SELECT step.service,
       EXISTS (
           SELECT 1
             FROM queue_counts qc
            WHERE qc.service = step.service
              AND qc.ready_count > 0
              AND qc.ready_count <= $3
       ) AS became_claimable,
       step.ready_count + step.running_count + (
           SELECT coalesce(sum(other.ready_count + other.running_count), 0)
             FROM user_work other
            WHERE other.job_id = $1
              AND other.step_index <> $2
       )::integer AS job_open_items
  FROM step;
