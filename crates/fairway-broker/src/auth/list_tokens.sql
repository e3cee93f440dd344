-- Every token, oldest first, without its hash.
SELECT id, name, role, tenants, services, created_at, expires_at, revoked_at, last_used_at
  FROM tokens
 ORDER BY id;
