//! Every statement of the endings duty, one per `.sql` file beside it, or a call of a server
//! function of `sql/endings/`: ending attempts (with the workflow growth that follows them),
//! leases and retries.

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
        "SELECT * FROM finish_items($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
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
    }
}

/// An ending finish_items answered: applied, or (`applied` None) deferred, its owner held by
/// another transaction.
pub struct FinishedRow {
    /// The 1-based index of the ending in the batch.
    pub ending: i32,
    pub applied: Option<AppliedEnding>,
}

impl FromRow for FinishedRow {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        let deferred: bool = row.try_get("deferred")?;
        let applied = if deferred { None } else { Some(AppliedEnding::from_row(row)?) };
        Ok(Self { ending: row.try_get("ending")?, applied })
    }
}

row! {
    /// Where an applied ending's item belongs, for the metrics and the querier's lifecycle.
    AppliedEnding {
        job_id: Uuid,
        service: String,
        tenant: String,
        /// Whether the querier that held the item is shutting down.
        querier_leaving: bool,
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
