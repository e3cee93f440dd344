-- Querier $1 announced its shutdown: no more work for it. It stays in its shards until it
-- holds no lease, and is forgotten once it holds none and has not been heard for the forget
-- delay (retire_queriers.sql); its next request then joins it afresh. No row: no such querier.
UPDATE queriers
   SET state = 'shutting_down', last_seen = now()
 WHERE querier = $1
RETURNING querier;
