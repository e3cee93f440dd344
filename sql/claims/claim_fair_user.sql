-- claim_fair_user: the user the fair order serves next, for one item of a worker's request,
-- locked. The order's first three levels:
-- 1. Component: the worker visits the components with claimable work (list_components) from
--    its slot modulo their number, wrapping, until one yields a user.
-- 2. Tenant, within the component: active tenant_queues rows by work in progress divided by
--    the tenant's weight (share), then least recently worked, leaving out tenants sharded to
--    other queriers and those the batch passed over.
-- 3. User, within the tenant: the first in service_users_fair_order (least work in progress
--    over all services divided by the user's weight, then least recently worked) whose users
--    row is free, among the users in the order: one at its cap or with an empty bucket has
--    left the index (in_order) until an ending or its due time puts it back. SKIP LOCKED sends
--    a concurrent claimer on to the next user, tenant or component instead of queueing.
--
-- A queue row's copies of the user's counts and policy may lag them, never lead: claims move
-- only the row they claim from. A row found lagging at the head is brought level
-- (level_queue_rows), and the answer says stale: the caller reads the order again, so that
-- the user it serves is the one that truly goes first.
--
-- Arguments: the service, querier, its components, the worker's slot, and the tenant queues
-- passed over, as ROW(service, component, tenant)::text.
-- Answer: username NULL when no user is free; else the user, its tenant and component, whether
-- its row was stale, its queue row's ready count and its own jobs' (not under an actor) ready
-- and running counts and last claim, and whether its tenant has a cap or a rate limit.
-- Locks: the chosen user's users row (FOR NO KEY UPDATE SKIP LOCKED), then level_queue_rows'.

CREATE OR REPLACE FUNCTION claim_fair_user(
    p_service text,
    p_querier text,
    p_components text[],
    p_worker integer,
    p_passed text[],
    OUT username text,
    OUT tenant text,
    OUT component text,
    OUT stale boolean,
    OUT ready_count integer,
    OUT local_ready integer,
    OUT local_running integer,
    OUT local_last_worked timestamptz,
    OUT tenant_policed boolean
)
LANGUAGE plpgsql
AS $user$
DECLARE
    v_count integer := cardinality(p_components);
    v_levelled integer;
BEGIN
    FOR turn IN 0 .. v_count - 1 LOOP
        component := p_components[1 + (p_worker + turn) % v_count];
        SELECT best.username, tq.tenant, best.stale, best.ready_count, best.local_ready,
               best.local_running, best.local_last_worked,
               t.max_running > 0 OR t.rate_per_second > 0
          INTO username, tenant, stale, ready_count, local_ready, local_running,
               local_last_worked, tenant_policed
          FROM tenant_queues tq
          JOIN tenants t ON t.tenant = tq.tenant
         CROSS JOIN LATERAL (
               SELECT u.username,
                      (u.running_count, u.last_worked, u.weight, u.max_running,
                       u.throttled_until IS NOT NULL)
                          IS DISTINCT FROM (su.running_count, su.last_worked, su.weight,
                                            su.max_running, su.throttled) AS stale,
                      su.ready_count, su.local_ready, su.local_running, su.local_last_worked
                 FROM service_users su
                 JOIN users u ON u.username = su.username
                WHERE su.service = p_service
                  AND su.component = tq.component
                  AND su.tenant = tq.tenant
                  AND su.in_order
                  AND su.ready_count > 0
                ORDER BY {{user_order su}}
                LIMIT 1
                  FOR NO KEY UPDATE OF u SKIP LOCKED
               ) best
         WHERE tq.service = p_service
           AND tq.component = claim_fair_user.component
           AND tq.active
           AND ROW(tq.service, tq.component, tq.tenant)::text <> ALL (p_passed)
           -- A scalar subquery, not EXISTS: it stays a primary-key probe per tenant.
           AND (NOT t.sharded
                OR (SELECT true
                      FROM tenant_shards ts
                     WHERE ts.tenant = tq.tenant
                       AND ts.querier = p_querier))
         ORDER BY {{tenant_order tq}}
         LIMIT 1;
        EXIT WHEN FOUND;
    END LOOP;
    IF stale IS NOT TRUE THEN
        RETURN;
    END IF;
    v_levelled := level_queue_rows(p_service, component, tenant, username);
END;
$user$;
