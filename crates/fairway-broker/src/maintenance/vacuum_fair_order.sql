-- The fair order lives in small rows rewritten on every claim and completion, and each rewrite
-- leaves the old version's index entries behind, right where the next claim starts reading:
-- at the head of the order. Autovacuum visits a database at most once a minute by default,
-- long enough for a busy broker to bury the head under many pages of dead entries. Tables
-- another vacuum is working on are skipped rather than waited for. The log of tenant running
-- changes takes a row per ending while tenants compete, and every claim batch reads it.
-- No truncation: these tables empty and refill their last pages all the time, and a vacuum
-- that tries to truncate them waits for an exclusive lock the claims never leave free, up to
-- 5 s per table, in which no other pass runs (seen in pg_stat_activity as VacuumTruncate).
-- The claimable steps, the strategies' running counts and their log churn the same way.
VACUUM (SKIP_LOCKED, TRUNCATE false) users, service_users, user_work, tenant_queues, actor_queues,
    tenant_running_changes, claimable_steps, claimable_step_metadata, strategy_running,
    strategy_running_changes;
