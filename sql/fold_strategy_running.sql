-- Folds the strategies' running-count log into every strategy_running row no other
-- transaction holds (see sql/functions/fold_strategy_running.sql), so that the log that
-- prefer_distinct sums and the usage report reads stays short.
SELECT fold_strategy_running(NULL, NULL, NULL) AS folded;
