-- Pauses ($2 true) or resumes ($2 false) job $1's steps: their ready items leave or rejoin the
-- user's claimable counts. Returns each service whose claimable count changed.
WITH steps AS (
    UPDATE user_work
       SET paused = $2
     WHERE job_id = $1
       AND paused <> $2
 RETURNING username, service, ready_count
), per_service AS (
    SELECT username, service, sum(ready_count)::integer AS ready
      FROM steps
     GROUP BY username, service
), queue_counts AS (
    UPDATE service_users su
       SET ready_count = su.ready_count + CASE WHEN $2 THEN -ps.ready ELSE ps.ready END
      FROM per_service ps
     WHERE su.username = ps.username
       AND su.service = ps.service
)
SELECT ps.service
  FROM per_service ps
 WHERE ps.ready > 0;
