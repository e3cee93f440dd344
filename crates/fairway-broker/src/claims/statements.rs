//! Every statement of the claims duty, one per `.sql` file beside it, or a call of a server
//! function of `sql/claims/`: the claim batch, the long poll's checks and the asks for work.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::db::sql::{row, statement};
use crate::error::BrokerError;
use fairway_api::model::{JobId, WorkItem, WorkItemId};

statement! {
    /// Claims for a batch of workers in one transaction (`sql/claims/claim_items.sql`):
    /// request i is the i-th of each array.
    ClaimItems<'a> = function "SELECT * FROM claim_items($1, $2, $3, $4, $5, $6, $7, $8)"
        -> ClaimedRow {
        services: &'a [&'a str],
        queriers: &'a [&'a str],
        /// The worker slot of the querier that asks.
        workers: &'a [i32],
        /// Most items the request takes.
        maxes: &'a [i32],
        lease_millis: i64,
        /// How often, at most, a querier's last_seen moves.
        touch_every_millis: i64,
        /// The request's strategy; None for the fair order.
        strategies: &'a [Option<&'a Value>],
        /// The token the request came with; None without one.
        tokens: &'a [Option<i64>],
    }
}

row! {
    /// A claimed item, or (with `id` NULL) how a request of the batch that got nothing stands.
    ClaimedRow {
        /// The 1-based index of the request in the batch.
        request: i32,
        /// The querier's membership: NULL when it has not joined.
        querier_state: Option<String>,
        username: Option<String>,
        id: Option<i64>,
        job_id: Option<Uuid>,
        step_index: Option<i32>,
        component: Option<String>,
        payload: Option<Json<Box<RawValue>>>,
        inputs: Option<Json<Box<RawValue>>>,
        attempt: Option<i32>,
        lease_expires_at: Option<DateTime<Utc>>,
        tenant: Option<String>,
        actor: Option<Vec<String>>,
        /// A strategy that stopped before the fair order passed over work another claim held.
        passed_over: Option<bool>,
        /// The producer's trace the item's job was submitted in, if any.
        traceparent: Option<String>,
        /// Why the request got fewer items than it asked for under its service's policy:
        /// `cap` or `rate`.
        limited: Option<String>,
        /// For a rate limit, in how many milliseconds the next item is due.
        retry_ms: Option<i64>,
    }
}

statement! {
    /// Whether the service has claimable work for the querier at all, and if only users at
    /// their cap or out of tokens have it, when the first of those is due.
    HasClaimableWork<'a> = function "SELECT * FROM has_claimable_work($1, $2)"
        -> ClaimableWork {
        service: &'a str,
        querier: &'a str,
    }
}

row! {
    ClaimableWork {
        /// Whether a user in the fair order has it (so another transaction held it).
        in_order: bool,
        /// When a rate-limited user's next item is due, if only such users have it.
        throttled_until: Option<DateTime<Utc>>,
    }
}

statement! {
    /// Whether any job has named the service.
    ServiceIsNamed<'a> = "service_is_named" -> Named {
        service: &'a str,
    }
}

row! {
    Named {
        named: bool,
    }
}

statement! {
    /// Keeps, per service, the latest time a worker asked for its work.
    RecordServiceAsks<'a> = "record_service_asks" -> () {
        services: &'a [&'a str],
        asked_at: &'a [DateTime<Utc>],
    }
}

statement! {
    ListServiceAsks = "list_service_asks" -> ServiceAsked {}
}

row! {
    ServiceAsked {
        service: String,
        last_asked: DateTime<Utc>,
    }
}

impl ClaimedRow {
    /// The claimed item, of `service`, which the row does not repeat; None for a row that
    /// reports on a request without an item. An item's row missing a column means the function
    /// and this build disagree: the batch is lost rather than an item dropped unseen.
    pub fn into_work_item(self, service: &str) -> Result<Option<WorkItem>, BrokerError> {
        let row = self;
        let Some(id) = row.id else {
            return Ok(None);
        };
        let item = (|| {
            Some(WorkItem {
                id: WorkItemId(id),
                job_id: JobId(row.job_id?),
                service: service.to_owned(),
                step: row.step_index?,
                user: row.username?,
                tenant: row.tenant?,
                actor: row.actor?,
                component: row.component?,
                payload: row.payload?.0,
                inputs: row.inputs?.0,
                attempt: row.attempt?,
                lease_expires_at: row.lease_expires_at?,
                traceparent: row.traceparent,
            })
        })();
        item.map(Some).ok_or(BrokerError::BatchLost)
    }
}
