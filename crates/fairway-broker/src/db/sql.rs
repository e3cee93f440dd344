//! Every statement the broker runs, one named file each under `sql/`, and the thin helpers that run them as cached prepared statements. The
//! server functions those statements call live in `sql/functions/` (see `functions.rs`).

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row};

/// Declares a `&str` constant per statement, read at build time from the workspace's `sql/`
/// folder (`$folder` names a subfolder for a tool's own statements, or is empty).
#[macro_export]
macro_rules! statements {
    ($folder:literal; $($name:ident = $file:literal;)*) => {
        $(
            pub const $name: &str = include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"), "/../../sql/", $folder, $file, ".sql"
            ));
        )*
    };
}

statements! {
    "";
    APPLY_STEP_DELTAS = "apply_step_deltas";
    APPLY_TENANT_DELTAS = "apply_tenant_deltas";
    CANCEL_JOB_ITEMS = "cancel_job_items";
    CHECK_CONSISTENCY = "check_consistency";
    CLAIM_ITEMS = "claim_items";
    COUNT_OUTSTANDING = "count_outstanding";
    CREATE_STEP_QUEUES = "create_step_queues";
    CREATE_TENANT = "create_tenant";
    CREATE_USER = "create_user";
    DESCRIBE_ITEM = "describe_item";
    ENSURE_ADMIN_TOKEN = "ensure_admin_token";
    EXTEND_LEASE = "extend_lease";
    FIND_EXPIRED_LEASES = "find_expired_leases";
    FIND_PRUNABLE_JOBS = "find_prunable_jobs";
    FIND_TOKEN = "find_token";
    FINISH_ITEMS = "finish_items";
    FOLD_STRATEGY_RUNNING = "fold_strategy_running";
    GET_JOB = "get_job";
    GET_JOBS_STEPS = "get_jobs_steps";
    HAS_CLAIMABLE_WORK = "has_claimable_work";
    INSERT_TOKEN = "insert_token";
    ITEM_CREATION_TIMES = "item_creation_times";
    INSERT_AGGREGATE_ITEM = "insert_aggregate_item";
    INSERT_FIRST_STEP_ITEMS = "insert_first_step_items";
    INSERT_JOB = "insert_job";
    INSERT_JOB_METADATA = "insert_job_metadata";
    INSERT_JOB_STEPS = "insert_job_steps";
    INSERT_NEXT_STEP_ITEMS = "insert_next_step_items";
    JOB_TENANT = "job_tenant";
    JOIN_QUERIER = "join_querier";
    LIST_JOB_ITEMS = "list_job_items";
    LIST_QUERIERS = "list_queriers";
    LIST_TENANT_JOBS = "list_tenant_jobs";
    LIST_TENANTS = "list_tenants";
    LIST_TOKENS = "list_tokens";
    LIST_USER_JOBS = "list_user_jobs";
    LIST_USER_SHARES = "list_user_shares";
    LIST_USER_WORK = "list_user_work";
    LOCK_IDLE_TENANT_QUEUES = "lock_idle_tenant_queues";
    LOCK_JOB_OWNER = "lock_job_owner";
    LOCK_MEMBERSHIP = "lock_membership";
    LOCK_PRUNER = "lock_pruner";
    LOCK_TENANT_LIMIT = "lock_tenant_limit";
    LOCK_USER = "lock_user";
    NOTIFY_JOB_FINISHED = "notify_job_finished";
    NOTIFY_WORK_READY = "notify_work_ready";
    PLAN_AGGREGATE_ITEM = "plan_aggregate_item";
    PRUNE_ITEMS = "prune_items";
    PRUNE_JOBS = "prune_jobs";
    RECOUNT_TENANT_RUNNING = "recount_tenant_running";
    REFRESH_JOB_STATUS = "refresh_job_status";
    REFRESH_METRICS = "refresh_metrics";
    RESHARD_TENANTS = "reshard_tenants";
    RETIRE_QUERIERS = "retire_queriers";
    RETIRE_TENANT_QUEUES = "retire_tenant_queues";
    REVOKE_TOKEN = "revoke_token";
    SET_JOB_PAUSED = "set_job_paused";
    STRATEGY_USAGE = "strategy_usage";
    SET_JOB_STATUS = "set_job_status";
    SERVICE_IS_NAMED = "service_is_named";
    SHUT_DOWN_QUERIER = "shut_down_querier";
    TOKENS_EXIST = "tokens_exist";
    TOUCH_QUERIER = "touch_querier";
    TOUCH_TOKEN = "touch_token";
    UPSERT_TENANT = "upsert_tenant";
    VACUUM_FAIR_ORDER = "vacuum_fair_order";
}

pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

pub async fn query(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query(&statement, params).await
}

pub async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query_opt(&statement, params).await
}

pub async fn query_one(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Row, Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query_one(&statement, params).await
}

pub async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, Error> {
    let statement = client.prepare_cached(sql).await?;
    client.execute(&statement, params).await
}

/// A duration as the whole milliseconds statements take it in (bigint), saturating.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
