-- What /metrics reads from the database: the gauges, taken at most once per --metrics-refresh
-- by whichever broker finds them stale and kept here for every other broker to read
-- (sql/refresh_metrics.sql). One row.
CREATE TABLE metrics_snapshot (
    only_row boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    taken_at timestamptz NOT NULL DEFAULT '-infinity',
    gauges   jsonb       NOT NULL DEFAULT '[]'
);

INSERT INTO metrics_snapshot DEFAULT VALUES;

-- The paused items per service: paused steps with ready items, which no other index lists
-- (user_work_claimable leaves them out). Its columns already take part in user_work's indexes,
-- so the counter updates stay as they were; it gains an entry only while a job is paused.
CREATE INDEX user_work_paused ON user_work (service, tenant) WHERE paused AND ready_count > 0;
