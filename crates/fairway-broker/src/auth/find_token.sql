-- The token whose SHA-256 is $1, revoked or expired ones too (the broker says which).
SELECT id, name, role, tenants, services, hash, created_at, expires_at, revoked_at, last_used_at
  FROM tokens
 WHERE hash = $1;
