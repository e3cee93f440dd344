-- Ends the attempts of a batch: ending i records status $3[i] for attempt $2[i] of running item
-- $1[i], with results $4[i], error $5[i] and next component $6[i], keeping the report's digest
-- $7[i]; $8[i] takes the claim's attempt back (a release); with $9 only where the lease has
-- expired; with $10 waiting for owners' rows other transactions hold, else leaving those
-- endings untouched and answering them `deferred`; $11[i]: ending i's token id, which must
-- have claimed the attempt (NULL: any); $12[i]: a scheduled retry's delay in milliseconds;
-- $13[i]: the worker hands the item back (ready, the attempt not counted, $5[i] its reason);
-- $14[i]: a successful ending's warning.
-- See sql/functions/finish_items.sql.
SELECT ending, job_id, step_index, component, results_component, querier_leaving, fans_out,
       may_aggregate, service, tenant, became_claimable, tenant_applied,
       job_open_items, deferred
  FROM finish_items($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);
