-- Whether service $1 has claimable work at all: tells a claim that came back empty whether it
-- lost a race (try again) or there is nothing to do. Ordered like service_users_fair_order so
-- that the plan reads that index, whatever share of users has work.
SELECT 1
  FROM service_users
 WHERE service = $1
   AND ready_count > 0
 ORDER BY running_count, last_worked NULLS FIRST, username
 LIMIT 1;
