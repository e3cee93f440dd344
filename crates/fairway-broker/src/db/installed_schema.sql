-- What the database holds of the schema: the revision of its server functions and the last
-- migration applied.
SELECT (SELECT revision FROM fairway_functions) AS functions_revision,
       (SELECT format('V%s__%s', version, name)
          FROM fairway_schema_history
         ORDER BY version DESC
         LIMIT 1) AS schema_migration;
