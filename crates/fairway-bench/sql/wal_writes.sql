-- What the WAL from $1 to the last flushed record says was written: rows inserted, updated or
-- deleted; the updates that were not HOT; and index entries (pg_walinspect).
SELECT coalesce(sum(count) FILTER (WHERE record IN ('Heap/INSERT', 'Heap/UPDATE',
                                                    'Heap/HOT_UPDATE', 'Heap/DELETE')),
                0)::float8 AS rows,
       coalesce(sum(count) FILTER (WHERE record = 'Heap/UPDATE'), 0)::float8 AS cold_updates,
       coalesce(sum(count) FILTER (WHERE record IN ('Btree/INSERT_LEAF', 'Btree/INSERT_POST')),
                0)::float8 AS index_entries
  FROM (SELECT "resource_manager/record_type" AS record, count
          FROM pg_get_wal_stats($1::text::pg_lsn, pg_current_wal_flush_lsn(), true)) stats;
