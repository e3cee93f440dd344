-- Hands out the next work item of service $1 to worker $3 of querier $2, leased for $4
-- milliseconds, by Harmony's fair order. No row: no user with claimable work is free (none
-- has work, or every one is held by another transaction; the broker tells which and waits
-- without holding a connection). One row with `stale`: the chosen user was served since this
-- statement's snapshot was taken, so nothing was claimed and the broker looks again at once.
-- Otherwise one row: the claimed item.
--
-- Steps 1-3: the first user in service_users_fair_order (least work in progress over all
-- services, then least recently worked) whose users row is free. SKIP LOCKED sends a concurrent
-- claimer on to the next-best user instead of queueing behind the first.
-- Step 4: that user's best job step for the service, then the step's lowest ready item.
-- Step 5: the item is leased, and user_work, users and every service_users row of the user are
-- brought up to date in this same statement, so the counters never drift.
WITH chosen_user AS (
    -- The order comes from the snapshot; the users row is the latest version once locked. Its
    -- copies in service_users differ exactly when a claim or completion for this user
    -- committed after the snapshot: then the user's place in the order is out of date, and
    -- serving it now could give it two turns in a row.
    SELECT u.username,
           u.running_count IS DISTINCT FROM su.running_count
               OR u.last_worked IS DISTINCT FROM su.last_worked AS stale
      FROM service_users su
      JOIN users u ON u.username = su.username
     WHERE su.service = $1
       AND su.ready_count > 0
     ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
     LIMIT 1
       FOR NO KEY UPDATE OF u SKIP LOCKED
), chosen_step AS (
    -- Compared with scalar subqueries rather than joined, so that the index's leading columns
    -- are bound and it yields rows already in order: no sort of the user's jobs or the job's
    -- items, however many there are.
    SELECT uw.job_id, uw.step_index
      FROM user_work uw
     WHERE uw.service = $1
       AND uw.username = (SELECT username FROM chosen_user WHERE NOT stale)
       AND uw.ready_count > 0
       AND NOT uw.paused
     ORDER BY uw.is_async, uw.last_worked NULLS FIRST, uw.job_id, uw.step_index
     LIMIT 1
), chosen_item AS (
    SELECT wi.id
      FROM work_items wi
     WHERE wi.job_id = (SELECT job_id FROM chosen_step)
       AND wi.step_index = (SELECT step_index FROM chosen_step)
       AND wi.status = 'ready'
     ORDER BY wi.id
     LIMIT 1
       FOR NO KEY UPDATE OF wi SKIP LOCKED
), claimed AS (
    UPDATE work_items wi
       SET status = 'running',
           attempt = wi.attempt + 1,
           lease_expires_at = now() + $4::bigint * interval '1 millisecond',
           querier = $2,
           worker = $3,
           updated_at = now()
      FROM chosen_item ci
     WHERE wi.id = ci.id
 RETURNING wi.id, wi.job_id, wi.step_index, wi.payload, wi.inputs, wi.attempt, wi.lease_expires_at
), worked_at AS MATERIALIZED (
    -- One instant for every row this claim touches, so users.last_worked equals the newest
    -- user_work.last_worked (the consistency check relies on it).
    SELECT clock_timestamp() AS at
), step_counts AS (
    UPDATE user_work uw
       SET ready_count = uw.ready_count - 1,
           running_count = uw.running_count + 1,
           last_worked = worked_at.at
      FROM claimed, worked_at
     WHERE uw.job_id = claimed.job_id
       AND uw.step_index = claimed.step_index
), user_counts AS (
    UPDATE users u
       SET running_count = u.running_count + 1,
           last_worked = worked_at.at
      FROM chosen_user cu, claimed, worked_at
     WHERE u.username = cu.username
 RETURNING u.username, u.running_count, u.last_worked
), queue_counts AS (
    UPDATE service_users su
       SET running_count = uc.running_count,
           last_worked = uc.last_worked,
           ready_count = su.ready_count - CASE WHEN su.service = $1 THEN 1 ELSE 0 END
      FROM user_counts uc
     WHERE su.username = uc.username
), job_started AS (
    UPDATE jobs j
       SET status = 'running', updated_at = now()
      FROM claimed
     WHERE j.job_id = claimed.job_id
       AND j.status = 'accepted'
)
SELECT cu.stale,
       cu.username,
       claimed.id,
       claimed.job_id,
       claimed.step_index,
       claimed.payload,
       claimed.inputs,
       claimed.attempt,
       claimed.lease_expires_at
  FROM chosen_user cu
  LEFT JOIN claimed ON true;
