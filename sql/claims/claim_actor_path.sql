-- claim_actor_path: the fair order's fourth level, down a user's actor tree to the node whose
-- jobs go next. A node's best child actor goes before the node's own jobs when it has less work
-- in progress, or as much and was worked less recently (never worked counts as longest ago).
-- claim_items asks only when some of the user's ready work is under an actor.
--
-- Arguments: the user, service, component and tenant, and the user's own jobs' (at the root)
-- ready and running counts and last claim, from its service_users row.
-- Answer: the chosen node's path ('{}' for the user's own jobs).
-- Locks: none; reads actor_queues by key (the caller holds the user's row).

CREATE OR REPLACE FUNCTION claim_actor_path(
    p_username text,
    p_service text,
    p_component text,
    p_tenant text,
    p_own_ready integer,
    p_own_running integer,
    p_own_last_worked timestamptz
)
RETURNS text[]
LANGUAGE plpgsql
AS $actor$
DECLARE
    v_path text[] := '{}';
    v_child record;
BEGIN
    LOOP
        SELECT a.path, a.running_count, a.last_worked
          INTO v_child
          FROM actor_queues a
         WHERE (a.username, a.service, a.component, a.tenant, a.parent)
               = (p_username, p_service, p_component, p_tenant, v_path)
           AND a.ready_count > 0
         ORDER BY {{actor_order a}}
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        EXIT WHEN p_own_ready > 0
              AND (v_child.running_count, coalesce(v_child.last_worked, '-infinity'))
                  >= (p_own_running, coalesce(p_own_last_worked, '-infinity'));
        v_path := v_child.path;
        SELECT a.local_ready, a.local_running, a.local_last_worked
          INTO p_own_ready, p_own_running, p_own_last_worked
          FROM actor_queues a
         WHERE (a.username, a.service, a.component, a.tenant, a.path)
               = (p_username, p_service, p_component, p_tenant, v_path);
    END LOOP;
    RETURN v_path;
END;
$actor$;
