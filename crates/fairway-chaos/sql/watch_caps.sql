-- Has the database itself keep the most items each capped user, tenant and service ever had
-- running: after each statement that starts items, the running items of each capped key it
-- touched are counted afresh, and chaos_cap_peaks keeps the highest count, and its cap then. A
-- claim of a capped key holds the key's lock until it commits, so the count is what that claim
-- left behind.
CREATE TABLE IF NOT EXISTS chaos_cap_peaks (
    kind text        NOT NULL,
    key  text        NOT NULL,
    peak bigint      NOT NULL,
    cap  integer     NOT NULL,
    at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (kind, key)
);

CREATE OR REPLACE FUNCTION chaos_watch_caps()
RETURNS trigger
LANGUAGE plpgsql
AS $watch$
BEGIN
    INSERT INTO chaos_cap_peaks AS p (kind, key, peak, cap)
    WITH touched AS (
        SELECT DISTINCT uw.username, uw.tenant, uw.service
          FROM started s
          JOIN user_work uw USING (job_id, step_index, component)
         WHERE s.status = 'running'
    ), running AS (
        SELECT uw.username, uw.tenant, uw.service
          FROM work_items w
          JOIN user_work uw USING (job_id, step_index, component)
         WHERE w.status = 'running'
    )
    SELECT counted.kind, counted.key, counted.running, counted.cap
      FROM (SELECT 'user' AS kind, u.username AS key, u.max_running AS cap,
                   (SELECT count(*) FROM running r WHERE r.username = u.username) AS running
              FROM users u
             WHERE u.max_running > 0
               AND u.username IN (SELECT username FROM touched)
             UNION ALL
            SELECT 'tenant', t.tenant, t.max_running,
                   (SELECT count(*) FROM running r WHERE r.tenant = t.tenant)
              FROM tenants t
             WHERE t.max_running > 0
               AND t.tenant IN (SELECT tenant FROM touched)
             UNION ALL
            SELECT 'service', sp.service, sp.max_running,
                   (SELECT count(*) FROM running r WHERE r.service = sp.service)
              FROM service_policies sp
             WHERE sp.max_running > 0
               AND sp.service IN (SELECT service FROM touched)) counted
        ON CONFLICT (kind, key) DO UPDATE
       SET (peak, cap, at) = (excluded.peak, excluded.cap, excluded.at)
     WHERE excluded.peak > p.peak;
    RETURN NULL;
END;
$watch$;

CREATE OR REPLACE TRIGGER chaos_watch_caps
    AFTER UPDATE ON work_items
    REFERENCING NEW TABLE AS started
    FOR EACH STATEMENT
    EXECUTE FUNCTION chaos_watch_caps();
