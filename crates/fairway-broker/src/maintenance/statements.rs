//! Every statement of the maintenance duty, one per `.sql` file beside it, or a call of a
//! server function of `sql/maintenance/`: the promoter, the pruner, the vacuum, the metrics
//! snapshot and what operators read of the fair order.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::db::sql::{row, statement};
use crate::metrics::GaugeRow;
use crate::rows::Stored;
use fairway_api::model::{JobStatus, StrategyUsage, UserShare, UserWorkRow};

statement! {
    /// Makes up to `limit` due scheduled items ready, unless another broker's pass holds the
    /// promoter's lock (`promoted` NULL).
    PromoteScheduledItems = function "SELECT promote_scheduled_items($1, $2) AS promoted"
        -> Promoted {
        lock: i64,
        limit: i32,
    }
}

row! {
    Promoted {
        promoted: Option<i32>,
    }
}

statement! {
    /// Takes the pruner's lock for the transaction, if no other transaction holds it.
    LockPruner = "lock_pruner" -> Locked {
        lock: i64,
    }
}

statement! {
    /// The maintenance leader's lock, held by its session.
    TryMaintenanceLeadership = "try_maintenance_leadership" -> Locked {
        lock: i64,
    }
}

row! {
    Locked {
        locked: bool,
    }
}

statement! {
    FindPrunableJobs = "find_prunable_jobs" -> PrunableJob {
        retention_millis: i64,
        limit: i64,
    }
}

row! {
    PrunableJob {
        job_id: Uuid,
    }
}

statement! {
    PruneItems<'a> = "prune_items" -> Deleted {
        job_ids: &'a [Uuid],
        limit: i64,
    }
}

row! {
    Deleted {
        deleted: i64,
    }
}

statement! {
    /// Deletes a batch of expired Idempotency-Keys.
    PruneIdempotencyKeys = "prune_idempotency_keys" -> Deleted {
        limit: i64,
    }
}

statement! {
    /// Deletes those of the jobs that have no items left.
    PruneJobs<'a> = "prune_jobs" -> PrunedJobRow {
        job_ids: &'a [Uuid],
    }
}

row! {
    PrunedJobRow {
        job_id: Uuid,
        username: String,
        tenant: String,
        status: Stored<JobStatus>,
    }
}

statement! {
    VacuumFairOrder = "vacuum_fair_order" -> () {}
}

statement! {
    /// The database's gauges, taken at most once per `every_millis` however many brokers ask.
    RefreshMetrics = "refresh_metrics" -> Gauges {
        every_millis: i64,
    }
}

row! {
    Gauges {
        gauges: Json<Vec<GaugeRow>>,
    }
}

statement! {
    ItemCreationTimes<'a> = "item_creation_times" -> ItemCreated {
        ids: &'a [i64],
    }
}

row! {
    ItemCreated {
        id: i64,
        created_at: DateTime<Utc>,
    }
}

statement! {
    /// The user_work table for operators, after the row keyed by the `after_` columns.
    ListUserWork<'a> = "list_user_work" -> UserWorkRow {
        service: Option<&'a str>,
        user: Option<&'a str>,
        limit: i64,
        after_user: Option<&'a str>,
        after_service: Option<&'a str>,
        after_job_id: Option<Uuid>,
        after_step: Option<i32>,
        after_component: Option<&'a str>,
    }
}

statement! {
    ListUserShares<'a> = "list_user_shares" -> UserShare {
        service: &'a str,
        limit: i64,
    }
}

statement! {
    StrategyUsageOf<'a> = "strategy_usage" -> StrategyUsage {
        service: &'a str,
        key: &'a str,
    }
}
