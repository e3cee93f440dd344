//! How the rows that the statements of `sql/` answer become the domain's documents: every
//! column a document reads is named here, beside no other logic, so that a statement's output
//! and its decoding change together. Scalar answers (a count, a flag) are read where they are
//! used.

use serde_json::value::RawValue;
use tokio_postgres::types::Json;
use tokio_postgres::Row;

use super::BrokerError;
use fairway_api::model::{
    progress, ItemStatus, JobDocument, JobId, JobStatus, Mismatch, StepDocument, StrategyUsage,
    UserShare, UserWorkRow, WorkItem, WorkItemId,
};
use fairway_api::pages::ItemDocument;
use fairway_api::tenancy::{QuerierDocument, TenantDocument};
use fairway_api::tokens::{Role, TokenDocument};

/// A claimed item (sql/claim_items.sql) of `service`, which the row does not repeat.
pub fn work_item(row: &Row, service: &str) -> Result<WorkItem, BrokerError> {
    Ok(WorkItem {
        id: WorkItemId(row.try_get("id")?),
        job_id: JobId(row.try_get("job_id")?),
        service: service.to_owned(),
        step: row.try_get("step_index")?,
        user: row.try_get("username")?,
        tenant: row.try_get("tenant")?,
        actor: row.try_get("actor")?,
        component: row.try_get("component")?,
        payload: row.try_get::<_, Json<Box<RawValue>>>("payload")?.0,
        inputs: row.try_get::<_, Json<Box<RawValue>>>("inputs")?.0,
        attempt: row.try_get("attempt")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
    })
}

/// A job (sql/get_job.sql) with its steps (sql/get_jobs_steps.sql, through `step_document`).
pub fn job_document(
    job_id: JobId,
    job: &Row,
    steps: Vec<StepDocument>,
) -> Result<JobDocument, BrokerError> {
    let status = stored_job_status(job.try_get("status")?)?;
    Ok(JobDocument {
        job_id,
        user: job.try_get("username")?,
        tenant: job.try_get("tenant")?,
        actor: job.try_get("actor")?,
        is_async: job.try_get("is_async")?,
        priority: job.try_get("priority")?,
        metadata: job.try_get("metadata")?,
        status,
        progress: progress(status, &steps),
        steps,
        created_at: job.try_get("created_at")?,
        updated_at: job.try_get("updated_at")?,
    })
}

pub fn step_document(row: &Row) -> Result<StepDocument, BrokerError> {
    let ready: i32 = row.try_get("ready_count")?;
    let running: i32 = row.try_get("running_count")?;
    let successful: i32 = row.try_get("successful_count")?;
    let failed: i32 = row.try_get("failed_count")?;
    let canceled: i32 = row.try_get("canceled_count")?;
    Ok(StepDocument {
        service: row.try_get("service")?,
        aggregate: row.try_get("aggregate")?,
        components: row.try_get("components")?,
        total: [ready, running, successful, failed, canceled].iter().map(|&n| i64::from(n)).sum(),
        ready,
        running,
        successful,
        failed,
        canceled,
    })
}

/// A row of sql/list_user_work.sql.
pub fn user_work_row(row: &Row) -> Result<UserWorkRow, BrokerError> {
    Ok(UserWorkRow {
        user: row.try_get("username")?,
        tenant: row.try_get("tenant")?,
        actor: row.try_get("actor")?,
        job_id: JobId(row.try_get("job_id")?),
        step: row.try_get("step_index")?,
        service: row.try_get("service")?,
        component: row.try_get("component")?,
        is_async: row.try_get("is_async")?,
        paused: row.try_get("paused")?,
        ready_count: row.try_get("ready_count")?,
        running_count: row.try_get("running_count")?,
        last_worked: row.try_get("last_worked")?,
    })
}

/// A row of sql/list_user_shares.sql.
pub fn user_share(row: &Row) -> Result<UserShare, BrokerError> {
    Ok(UserShare {
        user: row.try_get("username")?,
        running: row.try_get("running")?,
        ready: row.try_get("ready")?,
    })
}

/// A row of sql/strategy_usage.sql.
pub fn strategy_usage(row: &Row) -> Result<StrategyUsage, BrokerError> {
    Ok(StrategyUsage {
        value: row.try_get("value")?,
        running: row.try_get("running")?,
        ready: row.try_get("ready")?,
    })
}

/// A difference sql/check_consistency.sql found.
pub fn mismatch(row: &Row) -> Result<Mismatch, BrokerError> {
    Ok(Mismatch {
        table: row.try_get("table_name")?,
        key: row.try_get("row_key")?,
        recorded: row.try_get("recorded")?,
        actual: row.try_get("actual")?,
    })
}

/// A row of sql/list_queriers.sql.
pub fn querier_document(row: &Row) -> Result<QuerierDocument, BrokerError> {
    Ok(QuerierDocument {
        querier: row.try_get("querier")?,
        state: row.try_get("state")?,
        in_shards: row.try_get("in_shards")?,
        joined_at: row.try_get("joined_at")?,
        last_request_at: row.try_get("last_seen")?,
        leases: row.try_get("leases")?,
        tenants: row.try_get("tenants")?,
    })
}

/// A row of sql/list_tenants.sql.
pub fn tenant_document(row: &Row) -> Result<TenantDocument, BrokerError> {
    Ok(TenantDocument {
        tenant: row.try_get("tenant")?,
        max_queriers: row.try_get("max_queriers")?,
        max_outstanding: row.try_get("max_outstanding")?,
        sharded: row.try_get("sharded")?,
        outstanding: row.try_get("outstanding")?,
        queriers: row.try_get("queriers")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// A row of sql/list_job_items.sql.
pub fn item_document(row: &Row) -> Result<ItemDocument, BrokerError> {
    Ok(ItemDocument {
        id: WorkItemId(row.try_get("id")?),
        step: row.try_get("step_index")?,
        status: stored_item_status(row.try_get("status")?)?,
        attempt: row.try_get("attempt")?,
        payload: row.try_get::<_, Json<Box<RawValue>>>("payload")?.0,
        inputs: row.try_get::<_, Json<Box<RawValue>>>("inputs")?.0,
        results: row.try_get::<_, Option<Json<Box<RawValue>>>>("results")?.map(|json| json.0),
        error: row.try_get("error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub fn token_document(row: &Row) -> Result<TokenDocument, BrokerError> {
    let role: String = row.try_get("role")?;
    Ok(TokenDocument {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: Role::parse(&role).unwrap_or(Role::Reader),
        tenants: row.try_get("tenants")?,
        services: row.try_get("services")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        last_used_at: row.try_get("last_used_at")?,
    })
}

/// A job status as the database stores it; one this build does not know means the database
/// was changed under it.
pub fn stored_job_status(value: &str) -> Result<JobStatus, BrokerError> {
    JobStatus::parse(value).map_err(|_| {
        BrokerError::Unavailable(format!("unknown job status {value:?} in the database"))
    })
}

/// A work item status as the database stores it.
pub fn stored_item_status(value: &str) -> Result<ItemStatus, BrokerError> {
    ItemStatus::parse(value).map_err(|_| {
        BrokerError::Unavailable(format!("unknown work item status {value:?} in the database"))
    })
}
