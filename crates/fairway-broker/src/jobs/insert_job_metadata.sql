-- Job $1's metadata, keys $2 with values $3, and a running-count row per (service of the
-- job's steps $4, key, value) that has none yet: claims under a cap lock these rows and
-- never create them, so that no claim waits on another's insert. In key order, so that
-- concurrent submissions creating the same rows cannot wait for each other in a cycle.
WITH metadata AS (
    INSERT INTO job_metadata (job_id, key, value)
    SELECT $1, m.key, m.value
      FROM unnest($2::text[], $3::jsonb[]) AS m(key, value)
 RETURNING key, value
)
INSERT INTO strategy_running (service, key, value)
SELECT DISTINCT s.service, m.key, m.value
  FROM metadata m
 CROSS JOIN unnest($4::text[]) AS s(service)
 ORDER BY s.service, m.key, m.value
    ON CONFLICT (service, key, value) DO NOTHING;
