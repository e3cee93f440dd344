-- The upgrade drill's migration (tests/upgrade/main.rs): only a build with the test-only
-- `upgrade-drill` feature carries it. It adds, as a release's migration may: a column without
-- a default, which older brokers never name. The drill's finish_jobs sets it, so the test can
-- tell which jobs the drill's functions finished.
ALTER TABLE jobs ADD COLUMN finished_by_drill boolean;
