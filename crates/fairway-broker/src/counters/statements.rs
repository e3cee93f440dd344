//! Every statement that moves or checks the fair order's counters, one per `.sql` file beside
//! it, or a call of a server function of `sql/counters/`.

use uuid::Uuid;

use crate::db::sql::{row, statement};
use fairway_api::model::Mismatch;

statement! {
    /// Makes sure a step has its counter rows for each of the components.
    CreateStepQueues<'a> = function "SELECT create_step_queues($1, $2, $3)" -> () {
        job_id: Uuid,
        step: i32,
        components: &'a [&'a str],
    }
}

statement! {
    /// Moves a step's item counts of one component, with the fair-order rows that follow them.
    ApplyStepDeltas<'a> = function
        "SELECT * FROM apply_step_deltas($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)" -> StepChange {
        job_id: Uuid,
        step: i32,
        component: &'a str,
        ready: i32,
        running: i32,
        successful: i32,
        failed: i32,
        canceled: i32,
        scheduled: i32,
        /// The transaction's only step change: the tenant's row moves now too.
        tenant_now: bool,
    }
}

row! {
    /// All NULL when the job has no such step.
    StepChange {
        service: Option<String>,
        tenant: Option<String>,
        became_claimable: Option<bool>,
        job_open_items: Option<i32>,
    }
}

statement! {
    /// A transaction's tenant_queues changes, last and in key order, so that transactions
    /// that move several tenants take their rows in one order and cannot deadlock.
    ApplyTenantDeltas<'a> = function "SELECT apply_tenant_deltas($1, $2, $3, $4, $5)" -> () {
        services: &'a [String],
        components: &'a [String],
        tenants: &'a [String],
        running: &'a [i32],
        activate: &'a [bool],
    }
}

statement! {
    /// Brings the tenant rows' running counts back to a count of the running items, rows a
    /// claim or an activation holds excepted.
    RecountTenantRunning = function "SELECT recount_tenant_running()" -> () {}
}

statement! {
    CheckConsistency = "check_consistency" -> Mismatch {}
}

statement! {
    /// Folds the strategies' running-count log into every row no other transaction holds, so
    /// that the log that prefer_distinct sums and the usage report reads stays short.
    FoldStrategyRunning = function "SELECT fold_strategy_running(NULL, NULL, NULL)" -> () {}
}

statement! {
    /// Wakes the long polls of every broker waiting for the service's work.
    NotifyWorkReady<'a> = "notify_work_ready" -> () {
        service: &'a str,
    }
}
