//! How the rows that the broker's statements answer become the domain's documents: every
//! column a document reads is named here or in its statement's row type (each duty's
//! `statements.rs`), beside no other logic, so that a statement's output and its decoding
//! change together.

use std::error::Error;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::types::{FromSql, Json, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::sql::{row, FromRow};
use fairway_api::model::{
    progress, ItemStatus, JobDocument, JobId, JobStatus, Mismatch, StepDocument, StrategyUsage,
    UserShare, UserWorkRow, WorkItemId,
};
use fairway_api::pages::ItemDocument;
use fairway_api::retry::{Backoff, RetryPolicy};
use fairway_api::tenancy::{QuerierDocument, TenantDocument};
use fairway_api::tokens::{Role, TokenDocument};

/// A status as the database stores it, as text. One this build does not know fails the row's
/// decoding: the database was changed under it.
pub struct Stored<T>(pub T);

macro_rules! stored_status {
    ($type:ty, $what:literal) => {
        impl<'a> FromSql<'a> for Stored<$type> {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
                let text = <&str>::from_sql(ty, raw)?;
                <$type>::parse(text).map(Stored).map_err(|_| {
                    format!(concat!("unknown ", $what, " {:?} in the database"), text).into()
                })
            }

            fn accepts(ty: &Type) -> bool {
                <&str as FromSql>::accepts(ty)
            }
        }
    };
}

stored_status!(JobStatus, "job status");
stored_status!(ItemStatus, "work item status");

row! {
    /// A job as `jobs/get_job.sql` and the listings read it, without its steps.
    JobRow {
        job_id: Uuid,
        username: String,
        tenant: String,
        actor: Vec<String>,
        is_async: bool,
        priority: i32,
        metadata: Value,
        status: Stored<JobStatus>,
        retry_max_attempts: Option<i32>,
        retry_backoff: Option<String>,
        retry_initial_ms: Option<i64>,
        retry_max_ms: Option<i64>,
        not_before: Option<DateTime<Utc>>,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
    }
}

/// A job's retry policy from its `retry_` columns (all NULL: none, the broker's default).
pub fn retry_policy(
    max_attempts: Option<i32>,
    backoff: Option<&str>,
    initial_ms: Option<i64>,
    max_ms: Option<i64>,
) -> Option<RetryPolicy> {
    let millis = |ms: i64| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    Some(RetryPolicy {
        max_attempts: u32::try_from(max_attempts?).ok()?,
        backoff: Backoff::parse(backoff?).ok()?,
        initial: millis(initial_ms?),
        max: millis(max_ms?),
    })
}

/// A job with its steps (`jobs/get_jobs_steps.sql`, through `step_document`).
pub fn job_document(job: JobRow, steps: Vec<StepDocument>) -> JobDocument {
    let status = job.status.0;
    let retry = retry_policy(
        job.retry_max_attempts,
        job.retry_backoff.as_deref(),
        job.retry_initial_ms,
        job.retry_max_ms,
    );
    JobDocument {
        job_id: JobId(job.job_id),
        user: job.username,
        tenant: job.tenant,
        actor: job.actor,
        is_async: job.is_async,
        priority: job.priority,
        metadata: job.metadata,
        status,
        progress: progress(status, &steps),
        steps,
        retry: retry.map(|policy| policy.document()),
        not_before: job.not_before,
        created_at: job.created_at,
        updated_at: job.updated_at,
    }
}

row! {
    /// A step of `jobs/get_jobs_steps.sql`, its item counts summed over components.
    StepRow {
        job_id: Uuid,
        service: String,
        aggregate: bool,
        components: Vec<String>,
        ready_count: i32,
        scheduled_count: i32,
        running_count: i32,
        successful_count: i32,
        failed_count: i32,
        canceled_count: i32,
    }
}

pub fn step_document(step: StepRow) -> StepDocument {
    let (ready, scheduled, running, successful, failed, canceled) = (
        step.ready_count,
        step.scheduled_count,
        step.running_count,
        step.successful_count,
        step.failed_count,
        step.canceled_count,
    );
    StepDocument {
        service: step.service,
        aggregate: step.aggregate,
        components: step.components,
        total: [ready, scheduled, running, successful, failed, canceled]
            .iter()
            .map(|&n| i64::from(n))
            .sum(),
        ready,
        scheduled,
        running,
        successful,
        failed,
        canceled,
    }
}

impl FromRow for UserWorkRow {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
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
}

impl FromRow for UserShare {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(UserShare {
            user: row.try_get("username")?,
            running: row.try_get("running")?,
            ready: row.try_get("ready")?,
            weight: row.try_get("weight")?,
            tier: row.try_get("tier")?,
            max_running: row.try_get("max_running")?,
            rate_per_second: row.try_get("rate_per_second")?,
            at_cap: row.try_get("at_cap")?,
            throttled: row.try_get("throttled")?,
        })
    }
}

impl FromRow for StrategyUsage {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(StrategyUsage {
            value: row.try_get("value")?,
            running: row.try_get("running")?,
            ready: row.try_get("ready")?,
        })
    }
}

impl FromRow for Mismatch {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(Mismatch {
            table: row.try_get("table_name")?,
            key: row.try_get("row_key")?,
            recorded: row.try_get("recorded")?,
            actual: row.try_get("actual")?,
        })
    }
}

impl FromRow for QuerierDocument {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
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
}

impl FromRow for TenantDocument {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(TenantDocument {
            tenant: row.try_get("tenant")?,
            max_queriers: row.try_get("max_queriers")?,
            max_outstanding: row.try_get("max_outstanding")?,
            weight: row.try_get("weight")?,
            tier: row.try_get("tier")?,
            max_running: row.try_get("max_running")?,
            rate_per_second: row.try_get("rate_per_second")?,
            burst: row.try_get("burst")?,
            running: row.try_get("running")?,
            at_cap: row.try_get("at_cap")?,
            throttled_until: row.try_get("throttled_until")?,
            sharded: row.try_get("sharded")?,
            outstanding: row.try_get("outstanding")?,
            queriers: row.try_get("queriers")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl FromRow for ItemDocument {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(ItemDocument {
            id: WorkItemId(row.try_get("id")?),
            step: row.try_get("step_index")?,
            status: row.try_get::<_, Stored<ItemStatus>>("status")?.0,
            attempt: row.try_get("attempt")?,
            payload: row.try_get::<_, Json<Box<RawValue>>>("payload")?.0,
            inputs: row.try_get::<_, Json<Box<RawValue>>>("inputs")?.0,
            results: row.try_get::<_, Option<Json<Box<RawValue>>>>("results")?.map(|json| json.0),
            error: row.try_get("error")?,
            warning: row.try_get("warning")?,
            releases: row.try_get("releases")?,
            release_reason: row.try_get("release_reason")?,
            not_before: row.try_get("not_before")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl FromRow for TokenDocument {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
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
}

/// A token with the hash it is stored under (`auth/find_token.sql`), to compare before use.
pub struct TokenRow {
    pub token: TokenDocument,
    pub hash: Vec<u8>,
}

impl FromRow for TokenRow {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(TokenRow { token: TokenDocument::from_row(row)?, hash: row.try_get("hash")? })
    }
}
