-- The transaction that last made one of the user's steps claimable (track_claimable_step
-- records it). A set (claim_fair_round) reads the user's steps with its statement's snapshot
-- but locks the user later in the statement: a transaction recorded in between says a step
-- became claimable unseen, and the set stops before that user. A transaction id, not a count,
-- so that a transaction making many of a user's steps claimable writes the row once. A column
-- without a default is added without rewriting the table.
ALTER TABLE users ADD COLUMN step_made_claimable_by xid8;
