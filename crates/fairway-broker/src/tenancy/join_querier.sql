-- Querier $1 joins on its first work request. A row: it is new, and shards must be redrawn.
INSERT INTO queriers (querier) VALUES ($1)
    ON CONFLICT (querier) DO NOTHING
RETURNING querier;
