//! Every statement of the jobs duty, one per `.sql` file beside it or a call of a server
//! function: submissions and their idempotency keys, job control, listings.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::db::sql::{row, statement};
use crate::rows::{JobRow, StepRow};
use fairway_api::pages::ItemDocument;

statement! {
    /// Takes an Idempotency-Key for a submission, first in its transaction.
    RememberIdempotencyKey<'a> = "remember_idempotency_key" -> Remembered {
        scope: &'a str,
        key: &'a str,
        request_digest: &'a [u8],
        job_id: Uuid,
        response: Json<&'a Value>,
        ttl_millis: i64,
    }
}

row! {
    Remembered {
        remembered: bool,
    }
}

statement! {
    /// A live Idempotency-Key: what made it, and its answer.
    FindIdempotencyKey<'a> = "find_idempotency_key" -> IdempotencyKeyRow {
        scope: &'a str,
        key: &'a str,
    }
}

row! {
    IdempotencyKeyRow {
        job_id: Uuid,
        request_digest: Vec<u8>,
        response: Json<Value>,
    }
}

statement! {
    CreateUser<'a> = "create_user" -> () {
        user: &'a str,
    }
}

statement! {
    LockUser<'a> = "lock_user" -> () {
        user: &'a str,
    }
}

statement! {
    CreateTenant<'a> = "create_tenant" -> () {
        tenant: &'a str,
    }
}

statement! {
    /// The tenant's max_outstanding, locking its row when it has one.
    LockTenantLimit<'a> = "lock_tenant_limit" -> TenantLimit {
        tenant: &'a str,
    }
}

row! {
    TenantLimit {
        max_outstanding: i32,
    }
}

statement! {
    CountOutstanding<'a> = "count_outstanding" -> Outstanding {
        tenant: &'a str,
    }
}

row! {
    Outstanding {
        outstanding: i64,
    }
}

statement! {
    InsertJob<'a> = "insert_job" -> () {
        job_id: Uuid,
        user: &'a str,
        is_async: bool,
        tenant: &'a str,
        actor: &'a [String],
        priority: i32,
        retry_max_attempts: Option<i32>,
        retry_backoff: Option<&'a str>,
        retry_initial_ms: Option<i64>,
        retry_max_ms: Option<i64>,
        not_before: Option<DateTime<Utc>>,
        traceparent: Option<&'a str>,
    }
}

statement! {
    InsertJobSteps<'a> = "insert_job_steps" -> () {
        job_id: Uuid,
        services: &'a [&'a str],
        aggregates: &'a [bool],
    }
}

statement! {
    InsertJobMetadata<'a> = "insert_job_metadata" -> () {
        job_id: Uuid,
        keys: &'a [String],
        values: &'a [Value],
        services: &'a [&'a str],
    }
}

statement! {
    InsertFirstStepItems<'a> = "insert_first_step_items" -> () {
        job_id: Uuid,
        payloads: &'a [&'a Value],
        components: &'a [&'a str],
        /// Scheduled until then; None: ready.
        not_before: Option<DateTime<Utc>>,
    }
}

statement! {
    NotifyJobFinished = "notify_job_finished" -> () {
        job_id: Uuid,
    }
}

statement! {
    GetJob = "get_job" -> JobRow {
        job_id: Uuid,
    }
}

statement! {
    /// The steps of each of the jobs, by job and step.
    GetJobsSteps<'a> = "get_jobs_steps" -> StepRow {
        job_ids: &'a [Uuid],
    }
}

statement! {
    JobTenant = "job_tenant" -> JobTenantRow {
        job_id: Uuid,
    }
}

row! {
    JobTenantRow {
        tenant: String,
    }
}

statement! {
    /// Takes the row lock of the user who owns the job; no row, no such job.
    LockJobOwner = "lock_job_owner" -> () {
        job_id: Uuid,
    }
}

statement! {
    /// Pauses or resumes the job's steps (`sql/counters/pause_job_steps.sql`); answers the
    /// services whose work came back.
    SetJobPaused = function "SELECT * FROM pause_job_steps($1, $2)" -> ResumedService {
        job_id: Uuid,
        paused: bool,
    }
}

row! {
    ResumedService {
        service: String,
    }
}

statement! {
    SetJobStatus<'a> = "set_job_status" -> () {
        job_id: Uuid,
        status: &'a str,
    }
}

statement! {
    /// Cancels every ready, scheduled or running item of the job; answers how many, per step
    /// and component.
    CancelJobItems = "cancel_job_items" -> CanceledItems {
        job_id: Uuid,
    }
}

row! {
    CanceledItems {
        step_index: i32,
        component: String,
        ready: i32,
        scheduled: i32,
        running: i32,
    }
}

statement! {
    /// Puts every failed item of the job back to ready with a fresh retry budget; answers how
    /// many, per step and component.
    RetryJobItems = "retry_job_items" -> RetriedItems {
        job_id: Uuid,
    }
}

row! {
    RetriedItems {
        step_index: i32,
        component: String,
        retried: i32,
    }
}

statement! {
    /// The next page of jobs, in id order, that match a bulk action's filter.
    FindFilteredJobs<'a> = "find_filtered_jobs" -> FilteredJob {
        user: Option<&'a str>,
        tenant: Option<&'a str>,
        status: Option<&'a str>,
        service: Option<&'a str>,
        submitted_before: Option<DateTime<Utc>>,
        tenants: Option<&'a [String]>,
        after: Uuid,
        limit: i64,
    }
}

row! {
    FilteredJob {
        job_id: Uuid,
        status: String,
    }
}

statement! {
    /// A page of a user's jobs (`user` set, optionally only `tenant`'s) or of a tenant's
    /// (`user` NULL), newest first, optionally only those with a step on `service`.
    ListJobs<'a> = "list_jobs" -> JobRow {
        user: Option<&'a str>,
        tenant: Option<&'a str>,
        statuses: &'a [&'a str],
        before_created_at: DateTime<Utc>,
        before_job_id: Uuid,
        limit: i64,
        service: Option<&'a str>,
    }
}

statement! {
    ListJobItems<'a> = "list_job_items" -> ItemDocument {
        job_id: Uuid,
        statuses: &'a [&'a str],
        first_step: i32,
        last_step: i32,
        after_id: i64,
        limit: i64,
    }
}
