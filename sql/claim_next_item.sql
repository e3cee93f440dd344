-- Hands out the next work item of service $1 to worker slot $3 of querier $2, leased for $4
-- milliseconds; $5: how often, at most, the querier's last_seen moves; $6: whether the claim
-- may wait for its tenant's row. The search and its result are described with the function, in
-- migrations/V2__tenants_components_queriers.sql.
SELECT querier_state, stale, username, id, job_id, step_index, component, payload, inputs,
       attempt, lease_expires_at, tenant, actor
  FROM claim_next_item($1, $2, $3, $4, $5, $6);
