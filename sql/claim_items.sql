-- Claims for a batch of workers in one transaction: request i wants up to $4[i] items of
-- service $1[i] for worker slot $3[i] of querier $2[i], leased for $5 milliseconds; $6: how
-- often, at most, a querier's last_seen moves; $7[i]: request i's strategy, NULL for the fair
-- order; $8[i]: request i's token id, NULL without one. See sql/functions/claim_items.sql.
SELECT request, querier_state, username, id, job_id, step_index, component, payload, inputs,
       attempt, lease_expires_at, tenant, actor, passed_over, traceparent
  FROM claim_items($1, $2, $3, $4, $5, $6, $7, $8);
