-- A new token: name $1, role $2, tenants $3 and services $4 (NULL: all), hash $5, expiring $6
-- milliseconds from now (NULL: never). No row when a live token already has the name.
INSERT INTO tokens (name, role, tenants, services, hash, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
RETURNING id, name, role, tenants, services, created_at, expires_at, revoked_at, last_used_at;
