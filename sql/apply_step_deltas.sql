-- Moves the item counts of job $1's step $2, component $3, by the deltas $4 ready, $5 running,
-- $6 successful, $7 failed, $8 canceled, $9 scheduled, with every fair-order row that follows
-- them; the tenant's too when $10 says this is the transaction's only step change (otherwise
-- apply_tenant_deltas.sql takes it). See sql/functions/apply_step_deltas.sql.
SELECT service, tenant, became_claimable, job_open_items
  FROM apply_step_deltas($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);
