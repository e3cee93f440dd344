-- How many of this database's backends wait for a lock now (a row's, a transaction's, an
-- advisory lock's): sampled through a run, it tells how long claims and endings waited on each
-- other.
SELECT count(*)
  FROM pg_stat_activity a
 WHERE a.datname = current_database()
   AND a.wait_event_type = 'Lock'
