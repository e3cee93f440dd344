-- Every set of server functions the database holds, oldest first, and whether the tables'
-- trigger bindings call it.
SELECT fs.schema_name AS schema,
       fs.revision,
       fs.version,
       fs.installed_at,
       fs.last_used_at,
       EXISTS (SELECT 1
                 FROM pg_trigger t
                 JOIN pg_proc p ON p.oid = t.tgfoid
                 JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE NOT t.tgisinternal AND n.nspname = fs.schema_name) AS owns_triggers
  FROM function_sets fs
 ORDER BY fs.revision, fs.installed_at;
