-- Sets tenant $1's max_queriers $2 and max_outstanding $3, creating it if need be.
INSERT INTO tenants AS t (tenant, max_queriers, max_outstanding)
VALUES ($1, $2, $3)
    ON CONFLICT (tenant) DO UPDATE
   SET max_queriers = excluded.max_queriers,
       max_outstanding = excluded.max_outstanding,
       updated_at = now();
