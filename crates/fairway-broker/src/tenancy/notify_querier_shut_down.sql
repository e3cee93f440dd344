-- Wakes the long polls waiting in every broker when this transaction commits, so that those of
-- querier $1, which just shut down, end at once (410) rather than wait out their `wait`.
SELECT pg_notify('fairway_querier_shut_down', $1);
