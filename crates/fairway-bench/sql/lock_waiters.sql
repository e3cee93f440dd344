-- How many of this database's backends wait now for a row another transaction holds, or for
-- that transaction to end (a claim's or an ending's): sampled through a run, it tells how long
-- claims and endings waited on each other. Other lock waits (a querier joining, a relation
-- being extended) are not theirs.
SELECT count(*)
  FROM pg_stat_activity a
 WHERE a.datname = current_database()
   AND a.wait_event_type = 'Lock'
   AND a.wait_event IN ('tuple', 'transactionid')
