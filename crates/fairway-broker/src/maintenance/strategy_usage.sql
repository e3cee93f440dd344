-- For service $1 and metadata key $2: each value's running items (the row's count plus its
-- logged changes) and ready items (those of paused jobs included), in value order. Reads the
-- key's jobs through job_metadata_by_value and their steps by primary key.
WITH running AS (
    SELECT r.value,
           r.running + coalesce((SELECT sum(c.running)
                                   FROM strategy_running_changes c
                                  WHERE (c.service, c.key, c.value) = (r.service, r.key, r.value)),
                                0)::bigint AS running
      FROM strategy_running r
     WHERE (r.service, r.key) = ($1, $2)
), ready AS (
    SELECT m.value, sum(uw.ready_count)::bigint AS ready
      FROM job_metadata m
      JOIN user_work uw ON uw.job_id = m.job_id
     WHERE m.key = $2
       AND uw.service = $1
     GROUP BY m.value
)
SELECT coalesce(r.value, q.value) AS value,
       coalesce(r.running, 0) AS running,
       coalesce(q.ready, 0) AS ready
  FROM running r
  FULL JOIN ready q ON q.value = r.value
 WHERE coalesce(r.running, 0) > 0 OR coalesce(q.ready, 0) > 0
 ORDER BY 1;
