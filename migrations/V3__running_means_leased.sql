-- An item is running exactly when it holds a lease. Statements that address one item by id
-- say "running" as `lease_expires_at IS NOT NULL`: `status = 'running'` implies the predicates
-- of the partial indexes over running (and not-ready) items, so the planner may read the item
-- by a full scan of one of those instead of its primary key, priced from that index's row
-- estimate. Right after a bulk load those indexes are estimated empty while they grow with
-- every claim, and every completion then walked all of them until the next ANALYZE.
ALTER TABLE work_items
    ADD CONSTRAINT work_items_running_means_leased
        CHECK ((status = 'running') = (lease_expires_at IS NOT NULL));
