-- admit_tenant: whether a claim may hand out one more item of a tenant with a cap or a rate
-- limit. claim_items asks it before each item of such a tenant, and passes the tenant over for
-- the rest of the batch when the answer is not NULL, as it passes over a tenant another
-- transaction holds.
--
-- The tenant's row is locked first and never waited for: every claim of a policed tenant holds
-- it until it commits, so the claims of all brokers take turns, and the cap's count, read
-- afresh under the lock (tenant_running), includes every item they handed out. An ending lowers
-- the count without the lock; one not yet committed is still counted, which errs on the side of
-- the cap. The caller bills the bucket for the item it then takes (bucket_charged).
--
-- Arguments: the tenant.
-- Answer: limited NULL when an item may go out; else 'held' (another transaction holds the
-- row), 'cap' or 'rate', and for a rate, in how many milliseconds the next item is due.
-- Locks: the tenants row (FOR NO KEY UPDATE SKIP LOCKED).

CREATE OR REPLACE FUNCTION admit_tenant(p_tenant text, OUT limited text, OUT retry_ms bigint)
LANGUAGE plpgsql
AS $admit$
DECLARE
    v_policy record;
BEGIN
    SELECT t.max_running, t.rate_per_second, t.burst, t.next_free
      INTO v_policy
      FROM tenants t
     WHERE t.tenant = p_tenant
       FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        limited := 'held';
    ELSIF v_policy.max_running > 0 AND tenant_running(p_tenant) >= v_policy.max_running THEN
        limited := 'cap';
    ELSIF v_policy.rate_per_second > 0
          AND bucket_tokens(v_policy.rate_per_second, v_policy.burst, v_policy.next_free) = 0
    THEN
        limited := 'rate';
        retry_ms := retry_ms_until(bucket_due(v_policy.rate_per_second, v_policy.burst,
                                              v_policy.next_free));
    END IF;
END;
$admit$;
