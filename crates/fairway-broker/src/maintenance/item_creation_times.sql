-- When each of the items $1 was created: a claimed item's first attempt waited in the queue
-- from then (fairway_queue_wait_seconds). Primary key probes.
SELECT id, created_at FROM work_items WHERE id = ANY($1);
