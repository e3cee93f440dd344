-- An operator's retry (POST /jobs/{id}/retry) gives each failed item a fresh retry budget
-- without resetting its attempt number, which must keep growing so that a report for an
-- earlier attempt is still recognised as stale. `retry_base` is the attempt the item's
-- current budget starts from: an ending counts `attempt - retry_base` against --max-retries.
ALTER TABLE work_items ADD COLUMN retry_base integer NOT NULL DEFAULT 0 CHECK (retry_base >= 0);
