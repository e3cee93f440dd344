-- What the latest ending of an item's attempt recorded, so that a worker that sends its report
-- again (it never received the answer) gets the same answer instead of 409, and changes
-- nothing: the status the ending gave the item (`ready` for a retry), and a SHA-256 digest of
-- the report as the worker sent it (attempt, status, results and component, or error and
-- retryable), computed by the broker (src/broker/outcome.rs). NULL until an attempt ends, and
-- a NULL digest for an ending no worker reported (an expired lease). Written by finish_items
-- in the same row update that ends the attempt, so it costs no extra write.
--
-- Numbered V6: V5 belongs to another change; refinery accepts the gap.
ALTER TABLE work_items
    ADD COLUMN ended_as      work_item_status,
    ADD COLUMN ending_digest bytea;
