-- Serialises changes to querier membership and tenant shards across brokers, until commit.
SELECT pg_advisory_xact_lock(hashtextextended('fairway querier membership', 0));
