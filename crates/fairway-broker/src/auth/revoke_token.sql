-- Revokes token $1; one already revoked keeps its revoked_at. No row: no such token.
UPDATE tokens
   SET revoked_at = coalesce(revoked_at, now())
 WHERE id = $1
RETURNING id, name, role, tenants, services, created_at, expires_at, revoked_at, last_used_at;
