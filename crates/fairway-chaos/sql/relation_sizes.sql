-- The soak run's sample of the tables named in $1: each table's size and its indexes' size, in
-- bytes (TOAST counted with the table).
SELECT c.relname::text, pg_table_size(c.oid), pg_indexes_size(c.oid)
  FROM pg_class c
 WHERE c.relkind = 'r'
   AND c.relnamespace = current_schema()::regnamespace
   AND c.relname = ANY ($1::text[])
 ORDER BY c.relname;
