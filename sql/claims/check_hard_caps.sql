-- check_hard_caps: a strategy attempt's hard caps (max_simultaneous) for a job's step, checked
-- exactly: each capped value's strategy_running row is locked, never waited for
-- (fold_strategy_running), then its count read afresh, in a snapshot that holds every change
-- logged by the transactions that held the row before, and those this one logged since. So no
-- two transactions admit against the same count.
--
-- Arguments: the service, the job, and the attempt's caps ([{"key", "max", "hard"}]).
-- Answer: held, when another transaction holds a value's row (the step is passed over, and
-- looking again may find it free); else capped, the first value at its cap, as ROW(service,
-- key, value, max)::text; both empty when the step may be claimed.
-- Locks: the hard-capped values' strategy_running rows (SKIP LOCKED), held to commit.

CREATE OR REPLACE FUNCTION check_hard_caps(
    p_service text,
    p_job_id uuid,
    p_caps jsonb,
    OUT held boolean,
    OUT capped text
)
LANGUAGE plpgsql
AS $caps$
DECLARE
    v_cap record;
    v_running integer;
BEGIN
    held := false;
    FOR v_cap IN
        SELECT c ->> 'key' AS key, (c ->> 'max')::integer AS max, m.value
          FROM jsonb_array_elements(p_caps) c
          JOIN job_metadata m ON (m.job_id, m.key) = (p_job_id, c ->> 'key')
         WHERE (c ->> 'hard')::boolean
    LOOP
        IF NOT fold_strategy_running(p_service, v_cap.key, v_cap.value) THEN
            held := true;
            RETURN;
        END IF;
        SELECT r.running
               + coalesce((SELECT sum(l.running)
                             FROM strategy_running_changes l
                            WHERE (l.service, l.key, l.value) = (r.service, r.key, r.value)),
                          0)
          INTO v_running
          FROM strategy_running r
         WHERE (r.service, r.key, r.value) = (p_service, v_cap.key, v_cap.value);
        IF v_running >= v_cap.max THEN
            capped := ROW(p_service, v_cap.key, v_cap.value, v_cap.max::text)::text;
            RETURN;
        END IF;
    END LOOP;
END;
$caps$;
