-- Tenant $1's max_outstanding, locking its row when it has one: concurrent submissions for a
-- limited tenant then check and insert one at a time. Unlimited tenants take no lock.
SELECT max_outstanding
  FROM tenants
 WHERE tenant = $1
   AND max_outstanding > 0
   FOR NO KEY UPDATE;
