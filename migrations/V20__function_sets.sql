-- The sets of server functions the database holds, one schema each (src/db/functions.rs):
-- brokers of two releases run side by side, each calling its own set through its search_path.
-- A broker marks its set as in use while it runs; the maintenance leader drops a set that no
-- broker has marked for --function-set-retention. The trigger bindings are table-wide, so one
-- set owns them: the newest, by revision.
--
-- 0.1.0 kept its one set in public, recorded in fairway_functions; that set stays for the
-- 0.1.0 brokers still running during a roll, outside this table, and a later release removes it.
CREATE TABLE function_sets (
    schema_name  text        PRIMARY KEY,
    revision     integer     NOT NULL,
    -- SHA-256 of the files' names and text.
    digest       text        NOT NULL,
    -- The release of the broker that last marked the set as in use.
    version      text        NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz NOT NULL DEFAULT now()
);
