-- A worker may hand an item back (status `released`): the item is ready again at once and the
-- attempt does not count against its retry budget. What operators see of it: how often the
-- item was handed back, and the last reason given.
ALTER TABLE work_items
    ADD COLUMN releases integer NOT NULL DEFAULT 0,
    ADD COLUMN release_reason text;
