-- Wakes whoever waits for job $1 to finish (GET /jobs/{id}?wait=), in every broker, when this
-- transaction commits.
SELECT pg_notify('fairway_job_finished', $1::uuid::text);
