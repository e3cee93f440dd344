-- The last migration the database holds.
SELECT (SELECT format('V%s__%s', version, name)
          FROM fairway_schema_history
         ORDER BY version DESC
         LIMIT 1) AS schema_migration;
