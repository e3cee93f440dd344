-- Takes the maintenance leader's lock $1 for as long as this session lasts, if no other session
-- (another broker's leader) holds it: then `locked` is false, and the caller asks again later.
-- A session lock, not a transaction's: it is held while the leader's connection lives, and
-- PostgreSQL lets it go the moment that connection ends, however the broker ended.
SELECT pg_try_advisory_lock($1) AS locked;
