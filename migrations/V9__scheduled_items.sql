-- Retry policies with backoff, and scheduled items: an item that waits for a time before it
-- may be claimed (a retry under a delay, or a job submitted with not_before). A scheduled item
-- is not ready, so no claim and no fair-order counter sees it until the promoter
-- (sql/functions/promote_scheduled_items.sql) makes it ready once not_before has passed.

ALTER TYPE work_item_status ADD VALUE 'scheduled';

-- When a scheduled item may be claimed; NULL for every other item. A new enum value cannot be
-- used in the transaction that adds it, so the constraint and the index below say "scheduled"
-- through the enum's text and through not_before itself.
ALTER TABLE work_items
    ADD COLUMN not_before timestamptz,
    ADD CONSTRAINT work_items_scheduled_means_not_before
        CHECK ((status::text = 'scheduled') = (not_before IS NOT NULL));

-- The promoter's due items, earliest first: exactly the scheduled items.
CREATE INDEX work_items_scheduled ON work_items (not_before) WHERE not_before IS NOT NULL;

-- A step's scheduled items: open work (the job is not finished while it has some), but not
-- claimable, so no fair-order row counts them.
ALTER TABLE user_work
    ADD COLUMN scheduled_count integer NOT NULL DEFAULT 0,
    DROP CONSTRAINT user_work_not_negative,
    ADD CONSTRAINT user_work_not_negative CHECK (
        step_index >= 0
        AND ready_count >= 0
        AND running_count >= 0
        AND successful_count >= 0
        AND failed_count >= 0
        AND canceled_count >= 0
        AND scheduled_count >= 0
    );

-- The scheduled items per service, for the metrics, as user_work_paused does for paused ones.
CREATE INDEX user_work_scheduled ON user_work (service, tenant) WHERE scheduled_count > 0;

-- A job's retry policy, resolved at submission (the broker's defaults filled in), or all NULL:
-- the broker's --max-retries with an immediate retry. Delays in milliseconds.
ALTER TABLE jobs
    ADD COLUMN retry_max_attempts integer CHECK (retry_max_attempts BETWEEN 1 AND 100),
    ADD COLUMN retry_backoff text CHECK (retry_backoff IN ('none', 'fixed', 'exponential')),
    ADD COLUMN retry_initial_ms bigint CHECK (retry_initial_ms >= 0),
    ADD COLUMN retry_max_ms bigint CHECK (retry_max_ms >= 0),
    -- The time the job's submitted items were scheduled for, as the producer asked.
    ADD COLUMN not_before timestamptz,
    ADD CONSTRAINT jobs_retry_policy_whole CHECK (
        (retry_max_attempts IS NULL) = (retry_backoff IS NULL)
        AND (retry_max_attempts IS NULL) = (retry_initial_ms IS NULL)
        AND (retry_max_attempts IS NULL) = (retry_max_ms IS NULL)
    );
