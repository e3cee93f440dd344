-- Gives the seeded jobs what the strategy paths read, before the counters make their steps
-- claimable: job j (in job id order) has metadata customer = customer-(j mod 1000) and mode
-- = a or b by j's parity, and a priority from 0 to 999 hashed from j, so that every user
-- (job j's is j mod users) has jobs at every level; and each (service, key, value) its
-- running-count row, as a submission would create it.
WITH numbered AS (
    SELECT job_id, row_number() OVER (ORDER BY job_id) - 1 AS j FROM jobs
)
UPDATE jobs
   SET priority = abs(hashint8(n.j)::bigint) % 1000
  FROM numbered n
 WHERE n.job_id = jobs.job_id;
INSERT INTO job_metadata (job_id, key, value)
SELECT n.job_id, 'customer', to_jsonb('customer-' || n.j % 1000)
  FROM (SELECT job_id, row_number() OVER (ORDER BY job_id) - 1 AS j FROM jobs) n
UNION ALL
SELECT n.job_id, 'mode', to_jsonb(CASE WHEN n.j % 2 = 0 THEN 'a' ELSE 'b' END)
  FROM (SELECT job_id, row_number() OVER (ORDER BY job_id) - 1 AS j FROM jobs) n;
UPDATE user_work SET has_metadata = true;
INSERT INTO strategy_running (service, key, value)
SELECT DISTINCT uw.service, m.key, m.value
  FROM job_metadata m
  JOIN user_work uw ON uw.job_id = m.job_id
    ON CONFLICT DO NOTHING;
