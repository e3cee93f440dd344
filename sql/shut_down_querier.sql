-- Querier $1 announced its shutdown: no more work for it. It stays in its shards until it
-- holds no lease (retire_queriers.sql).
INSERT INTO queriers (querier, state) VALUES ($1, 'shutting_down')
    ON CONFLICT (querier) DO UPDATE
   SET state = 'shutting_down', last_seen = now();
