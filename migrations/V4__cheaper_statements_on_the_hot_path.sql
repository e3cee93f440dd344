-- Per-statement costs on the claim and completion paths, measured with perf on one backend
-- running claim_items and finish_items in a loop (docs/benchmarks.md has the numbers).

-- tenant_has_rivals is called from PL/pgSQL on every claim and completion. As a SQL-language
-- function called from PL/pgSQL it is parsed and planned again in every transaction; as
-- PL/pgSQL its one query keeps its cached plan for the life of the connection. Same result.
CREATE OR REPLACE FUNCTION tenant_has_rivals(p_service text, p_component text, p_tenant text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $rivals$
BEGIN
    -- A scalar subquery ordered like the primary key (EXISTS would drop the order), so that
    -- it is read from that index and stops at the first rival.
    RETURN (SELECT true
              FROM tenant_queues tq
             WHERE tq.service = p_service
               AND tq.component = p_component
               AND tq.tenant <> p_tenant
               AND tq.active
             ORDER BY tq.service, tq.component, tq.tenant
             LIMIT 1) IS NOT NULL;
END;
$rivals$;

-- Every statement that updates a row rebuilds each of the table's CHECK expressions from its
-- stored form. The counter tables are updated several times per claim, so their per-column
-- checks become one per table: the same rules, one expression to rebuild.
ALTER TABLE user_work
    DROP CONSTRAINT user_work_step_index_check,
    DROP CONSTRAINT user_work_ready_count_check,
    DROP CONSTRAINT user_work_running_count_check,
    DROP CONSTRAINT user_work_successful_count_check,
    DROP CONSTRAINT user_work_failed_count_check,
    DROP CONSTRAINT user_work_canceled_count_check,
    ADD CONSTRAINT user_work_not_negative CHECK (
        step_index >= 0
        AND ready_count >= 0
        AND running_count >= 0
        AND successful_count >= 0
        AND failed_count >= 0
        AND canceled_count >= 0
    );

ALTER TABLE service_users
    DROP CONSTRAINT service_users_ready_count_check,
    DROP CONSTRAINT service_users_local_ready_check,
    DROP CONSTRAINT service_users_local_running_check,
    ADD CONSTRAINT service_users_not_negative CHECK (
        ready_count >= 0 AND local_ready >= 0 AND local_running >= 0
    );

ALTER TABLE actor_queues
    DROP CONSTRAINT actor_queues_ready_count_check,
    DROP CONSTRAINT actor_queues_running_count_check,
    DROP CONSTRAINT actor_queues_local_ready_check,
    DROP CONSTRAINT actor_queues_local_running_check,
    ADD CONSTRAINT actor_queues_not_negative CHECK (
        ready_count >= 0 AND running_count >= 0 AND local_ready >= 0 AND local_running >= 0
    );
