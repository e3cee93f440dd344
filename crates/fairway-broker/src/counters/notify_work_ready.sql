-- Wakes the workers long-polling for service $1, in every broker, when this transaction commits.
SELECT pg_notify('fairway_work_ready', $1);
