-- Takes the pruner's lock $1 for the rest of the transaction, if no other transaction (another
-- broker's pruner) holds it: then `locked` is false, and the caller leaves the pruning to it.
SELECT pg_try_advisory_xact_lock($1) AS locked;
