-- promote_scheduled_items: makes up to p_limit scheduled items whose not_before has passed
-- ready, earliest first, and moves every counter as when a retry makes an item ready: the
-- step's scheduled and ready counts, the user's claimable counts (not for a paused job, whose
-- promoted items stay out of the fair order until it resumes), the tenant's queue and the
-- strategies' claimable steps (through apply_step_deltas and its triggers); a service whose
-- user's work became claimable is woken.
--
-- Brokers run it at once without doing the same work twice: one promotes while the others'
-- passes find the promoter's advisory lock taken and skip (`promoted` NULL); and should two
-- ever meet, an item already promoted is no longer scheduled and is left alone.
--
-- Arguments: p_lock, the promoter's advisory lock key; p_limit, most items per call.
-- Answer: how many items it promoted (NULL: another broker's pass holds the lock).
-- Locks: the advisory lock for the transaction; then the owners' users rows in username order,
-- waiting for each (the lock order, docs/design.md), then the items and counter rows, the
-- tenant rows last in key order (apply_tenant_deltas).

CREATE OR REPLACE FUNCTION promote_scheduled_items(p_lock bigint, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
AS $promote$
DECLARE
    v_due bigint[];
    v_owners text[];
    v_step record;
    v_change record;
    v_promoted integer := 0;
    v_services text[] := '{}';
    v_components text[] := '{}';
    v_tenants text[] := '{}';
    v_activate boolean[] := '{}';
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        RETURN NULL;
    END IF;
    -- The due items, through work_items_scheduled (it holds exactly the scheduled items).
    v_due := ARRAY(SELECT wi.id
                     FROM work_items wi
                    WHERE wi.not_before <= now()
                      AND wi.status = 'scheduled'
                    ORDER BY wi.not_before
                    LIMIT p_limit);
    IF cardinality(v_due) = 0 THEN
        RETURN 0;
    END IF;
    v_owners := ARRAY(SELECT (SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id)
                        FROM work_items wi
                       WHERE wi.id = ANY(v_due));
    PERFORM held.username
       FROM (SELECT DISTINCT w.username
               FROM unnest(v_owners) AS w(username)
              ORDER BY w.username) w
      CROSS JOIN LATERAL (SELECT u.username
                            FROM users u
                           WHERE u.username = w.username
                             FOR NO KEY UPDATE) held;

    FOR v_step IN
        WITH promoted AS (
            UPDATE work_items wi
               SET status = 'ready', not_before = NULL, updated_at = now()
             WHERE wi.id = ANY(v_due)
               AND wi.status = 'scheduled'
            RETURNING wi.job_id, wi.step_index, wi.component
        )
        SELECT p.job_id, p.step_index, p.component, count(*)::integer AS items
          FROM promoted p
         -- In no particular order: the owners' rows, held, guard every row below.
         GROUP BY p.job_id, p.step_index, p.component
    LOOP
        SELECT d.service, d.tenant, d.became_claimable
          INTO v_change
          FROM apply_step_deltas(v_step.job_id, v_step.step_index, v_step.component,
                                 v_step.items, 0, 0, 0, 0, -v_step.items, false) d;
        IF v_change.became_claimable THEN
            PERFORM pg_notify('fairway_work_ready', v_change.service);
        END IF;
        v_services := v_services || v_change.service;
        v_components := v_components || v_step.component;
        v_tenants := v_tenants || v_change.tenant;
        v_activate := v_activate || v_change.became_claimable;
        v_promoted := v_promoted + v_step.items;
    END LOOP;
    PERFORM apply_tenant_deltas(v_services, v_components, v_tenants,
                                array_fill(0, ARRAY[cardinality(v_services)]), v_activate);
    RETURN v_promoted;
END;
$promote$;
