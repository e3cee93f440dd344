//! Every statement of the endings duty, one per `.sql` file beside it, or a call of a server
//! function of `sql/endings/`: ending attempts, leases, workflow growth and retries.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::types::Json;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::sql::{row, statement, FromRow};
use crate::rows::Stored;
use fairway_api::model::ItemStatus;

statement! {
    /// Ends the attempts of a batch (`sql/endings/finish_items.sql`): ending i is the i-th of
    /// each array.
    FinishItems<'a> = function
        "SELECT * FROM finish_items($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        -> FinishedRow {
        /// The running item the ending is for.
        ids: &'a [i64],
        /// The attempt it reports on: an older attempt's report changes nothing.
        attempts: &'a [i32],
        statuses: &'a [&'a str],
        results: &'a [Option<Json<&'a Vec<Value>>>],
        errors: &'a [Option<&'a str>],
        /// The component the item's results go to next, if the workflow says.
        next_components: &'a [Option<&'a str>],
        /// The report's digest, kept to tell a repeated report from a conflicting one.
        digests: &'a [Option<&'a [u8]>],
        /// Takes the claim's attempt back, so that it does not count.
        uncounted: &'a [bool],
        /// Ends only attempts whose lease has expired: the reaper's endings.
        expired_only: bool,
        /// Waits for owners' rows other transactions hold; otherwise those endings are left
        /// untouched and answer deferred.
        wait_for_owners: bool,
        /// The token the report came with, which must have claimed the attempt; None: any.
        tokens: &'a [Option<i64>],
        /// A scheduled retry's delay (NULL for any other ending).
        delays_millis: &'a [Option<i64>],
        /// A worker handing the item back.
        handed_back: &'a [bool],
        /// A successful ending's warning.
        warnings: &'a [Option<&'a str>],
        /// The call is the whole transaction: it refuses a batch whose workflows may grow,
        /// and settles any other itself.
        in_one_statement: bool,
    }
}

/// An ending finish_items answered: applied, or (`applied` None) deferred, its owner held by
/// another transaction.
pub struct FinishedRow {
    /// The 1-based index of the ending in the batch.
    pub ending: i32,
    pub applied: Option<AppliedEnding>,
}

/// What finish_items answered a batch.
pub enum Finished {
    /// A row per ending that applied or was deferred.
    Endings(Vec<FinishedRow>),
    /// Asked to be the whole transaction, it found a workflow that may grow, and did nothing.
    NeedsTransaction,
}

impl Finished {
    pub fn from_rows(rows: &[Row]) -> Result<Self, tokio_postgres::Error> {
        if let [row] = rows {
            if row.try_get("needs_transaction")? {
                return Ok(Self::NeedsTransaction);
            }
        }
        Ok(Self::Endings(rows.iter().map(FinishedRow::from_row).collect::<Result<_, _>>()?))
    }
}

impl FromRow for FinishedRow {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        let deferred: bool = row.try_get("deferred")?;
        let applied = if deferred { None } else { Some(AppliedEnding::from_row(row)?) };
        Ok(Self { ending: row.try_get("ending")?, applied })
    }
}

row! {
    /// What an applied ending changed, and what must follow it in the same transaction.
    AppliedEnding {
        job_id: Uuid,
        step_index: i32,
        component: String,
        /// The component of the next step's items made from the results.
        results_component: Option<String>,
        querier_leaving: bool,
        fans_out: bool,
        may_aggregate: bool,
        service: String,
        tenant: String,
        became_claimable: bool,
        /// Whether the ending's tenant row moved already, or is left to the caller.
        tenant_applied: bool,
        job_open_items: i32,
    }
}

statement! {
    /// A heartbeat: a row when the lease of the current attempt was extended.
    ExtendLease = "extend_lease" -> LeaseEnd {
        id: i64,
        attempt: i32,
        lease_millis: i64,
        token: Option<i64>,
    }
}

row! {
    LeaseEnd {
        lease_expires_at: DateTime<Utc>,
    }
}

statement! {
    /// The item as an ending that did not apply needs it explained.
    DescribeItem = "describe_item" -> ItemState {
        id: i64,
    }
}

row! {
    ItemState {
        status: String,
        attempt: i32,
        claimed_by: Option<i64>,
        ended_as: Option<Stored<ItemStatus>>,
        ending_digest: Option<Vec<u8>>,
    }
}

statement! {
    FindExpiredLeases = "find_expired_leases" -> ExpiredLease {
        limit: i64,
    }
}

row! {
    ExpiredLease {
        id: i64,
        attempt: i32,
    }
}

statement! {
    /// Fan-out: the next step's items from an item's results.
    InsertNextStepItems = "insert_next_step_items" -> Created {
        id: i64,
        step: i32,
    }
}

row! {
    Created {
        count: i32,
    }
}

statement! {
    /// Whether the job's aggregating step is due its single item, and of which component.
    PlanAggregateItem = "plan_aggregate_item" -> AggregatePlan {
        job_id: Uuid,
    }
}

row! {
    AggregatePlan {
        step_index: i32,
        component: String,
    }
}

statement! {
    InsertAggregateItem<'a> = "insert_aggregate_item" -> () {
        job_id: Uuid,
        step: i32,
        component: &'a str,
    }
}

statement! {
    /// Finishes each of the jobs that has nothing ready or running
    /// (`sql/endings/finish_jobs.sql`).
    FinishJobs<'a> = function "SELECT finish_jobs($1)" -> () {
        /// In id order.
        job_ids: &'a [Uuid],
    }
}

statement! {
    /// The attempt each item's retry budget starts from, and its job's retry policy.
    ItemRetryPolicies<'a> = "item_retry_policies" -> ItemRetryPolicy {
        ids: &'a [i64],
    }
}

row! {
    ItemRetryPolicy {
        id: i64,
        retry_base: i32,
        retry_max_attempts: Option<i32>,
        retry_backoff: Option<String>,
        retry_initial_ms: Option<i64>,
        retry_max_ms: Option<i64>,
    }
}
