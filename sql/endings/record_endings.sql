-- record_endings: records a batch of endings on their items, as finish_items describes them,
-- for the endings whose owner the caller holds. An ending applies only to the attempt it
-- names of a running item, and with p_expired_only only once the lease has expired; with a
-- token, only to an attempt that token claimed (work_items.claimed_by; NULL: any attempt).
--
-- Arguments: finish_items' arrays, ending i the i-th of each; p_owners, the users whose
-- rows the caller holds.
-- Answer: a row per ending recorded (`i` says which): the status it recorded, its item's job,
-- step and component, where its results go, whether its querier is shutting down, and whether
-- it fans out to the next step or may complete an aggregate's inputs.
-- Locks: the items (the caller holds their owners' users rows).

CREATE OR REPLACE FUNCTION record_endings(
    p_ids bigint[],
    p_attempts integer[],
    p_statuses text[],
    p_results jsonb[],
    p_errors text[],
    p_next_components text[],
    p_digests bytea[],
    p_uncounted boolean[],
    p_expired_only boolean,
    p_tokens bigint[],
    p_delays_ms bigint[],
    p_handed_back boolean[],
    p_warnings text[],
    p_owners text[]
)
RETURNS TABLE (
    i bigint,
    status text,
    job_id uuid,
    step_index integer,
    component text,
    results_component text,
    querier_leaving boolean,
    fans_out boolean,
    may_aggregate boolean
)
LANGUAGE plpgsql
-- Runs from finish_items' generic plans, its only caller: every statement is a primary-key
-- probe per item whatever the arguments.
AS $record$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH requested AS (
        SELECT r.*
          FROM unnest(p_ids, p_attempts, p_statuses, p_results, p_errors, p_next_components,
                      p_digests, p_uncounted, p_delays_ms)
               WITH ORDINALITY
               AS r(id, attempt, status, results, error, next_component, digest, uncounted,
                    delay_ms, i)
    ), ended AS (
        UPDATE work_items wi
           SET status = r.status::work_item_status,
               results = r.results,
               error = CASE WHEN r.uncounted OR p_handed_back[r.i::integer]
                            THEN wi.error ELSE r.error END,
               retry_base = wi.retry_base
                            + CASE WHEN p_handed_back[r.i::integer] THEN 1 ELSE 0 END,
               releases = wi.releases
                          + CASE WHEN p_handed_back[r.i::integer] THEN 1 ELSE 0 END,
               release_reason = CASE WHEN p_handed_back[r.i::integer]
                                     THEN r.error ELSE wi.release_reason END,
               warning = p_warnings[r.i::integer],
               next_component = r.next_component,
               attempt = wi.attempt - CASE WHEN r.uncounted THEN 1 ELSE 0 END,
               ended_as = CASE WHEN r.uncounted THEN wi.ended_as
                               ELSE r.status::work_item_status END,
               ending_digest = CASE WHEN r.uncounted THEN wi.ending_digest ELSE r.digest END,
               lease_expires_at = NULL,
               not_before = CASE WHEN r.status = 'scheduled'
                                 THEN now() + r.delay_ms * interval '1 millisecond' END,
               updated_at = now()
          FROM requested r
         WHERE wi.id = r.id
           AND wi.attempt = r.attempt
           -- Running, spelled so that only the primary key can find the item (see
           -- work_items_running_means_leased).
           AND wi.lease_expires_at IS NOT NULL
           AND (NOT p_expired_only OR wi.lease_expires_at <= now())
           AND (p_tokens[r.i::integer] IS NULL OR wi.claimed_by = p_tokens[r.i::integer])
           AND (SELECT j.username FROM jobs j WHERE j.job_id = wi.job_id) = ANY (p_owners)
        RETURNING r.i,
                  r.status,
                  wi.job_id,
                  wi.step_index,
                  wi.component,
                  coalesce(wi.next_component, wi.component) AS results_component,
                  coalesce((SELECT q.state = 'shutting_down'
                              FROM queriers q
                             WHERE q.querier = wi.querier), false) AS querier_leaving,
                  (SELECT next.aggregate
                     FROM job_steps next
                    WHERE next.job_id = wi.job_id
                      AND next.step_index = wi.step_index + 1) IS FALSE
                      AND jsonb_array_length(coalesce(r.results, '[]')) > 0 AS fans_out,
                  EXISTS (SELECT 1
                            FROM job_steps agg
                           WHERE agg.job_id = wi.job_id
                             AND agg.aggregate)
                      AND r.status NOT IN ('ready', 'scheduled') AS may_aggregate
    )
    SELECT e.i, e.status, e.job_id, e.step_index, e.component, e.results_component,
           e.querier_leaving, e.fans_out, e.may_aggregate
      FROM ended e;
END;
$record$;
