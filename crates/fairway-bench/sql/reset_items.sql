-- Undoes what a path did to the work items: removes the items it added and makes every seeded
-- item ready again, so the next path starts from the same state.
DELETE FROM work_items WHERE id >= (SELECT first_added_id FROM bench_seed);
UPDATE work_items
   SET status = 'ready', attempt = 0, lease_expires_at = NULL, querier = NULL, worker = NULL,
       results = NULL, error = NULL
 WHERE status <> 'ready';
