-- Whether service $1 has claimable work at all: tells a claim that came back empty whether it
-- lost a race (try again) or there is nothing to do.
SELECT 1 FROM service_users WHERE service = $1 AND ready_count > 0 LIMIT 1;
