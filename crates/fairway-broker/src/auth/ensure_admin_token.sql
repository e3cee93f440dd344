-- The bootstrap admin token (FAIRWAY_ADMIN_TOKEN), named $1, of hash $2, unless its hash is
-- already there: a revoked one stays revoked.
INSERT INTO tokens (name, role, hash)
VALUES ($1, 'admin', $2)
ON CONFLICT DO NOTHING;
