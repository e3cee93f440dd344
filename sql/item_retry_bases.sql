-- The attempt each of items $1 counts its retry budget from (see V8__operator_retries.sql).
SELECT id, retry_base
  FROM work_items
 WHERE id = ANY($1::bigint[]);
