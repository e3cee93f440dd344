//! Producers submit jobs and steer them.

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::error::{ApiError, ErrorBody};
use super::{endpoint, non_empty, number, page_limit};
use crate::auth::{check_tenant, Caller};
use fairway_api::model::{
    ActorPath, ComponentName, ItemStatus, JobDocument, JobId, JobStatus, NewItem, NewJob,
    ServiceName, StepSpec, TenantName, UserName,
};
use fairway_api::pages::{
    ItemFilter, ItemsCursor, ItemsPage, JobOwner, JobsCursor, JobsFilter, JobsPage, ResultsCursor,
    ResultsPage,
};
use fairway_api::retry::RetrySpec;
use fairway_api::strategy::{parse_priority, Metadata};
use fairway_api::traceparent::TraceParent;
use fairway_broker::auth::Principal;
use fairway_broker::{Broker, IdempotencyKey, Submission};

/// The longest a producer may ask to wait for a job in one request, in seconds.
const MAX_WAIT_SECONDS: u64 = 60;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(
            endpoint("/jobs").route(web::post().to(submit_job)).route(web::get().to(list_jobs)),
        )
        .service(endpoint("/jobs/{job_id}").route(web::get().to(get_job)))
        .service(
            endpoint("/jobs/{job_id}/items")
                .route(web::post().to(append_items))
                .route(web::get().to(list_items)),
        )
        .service(endpoint("/jobs/{job_id}/results").route(web::get().to(job_results)))
        .service(endpoint("/jobs/{job_id}/retry").route(web::post().to(retry_job)))
        // After /items, /results and /retry: routes match in the order they are registered.
        .service(endpoint("/jobs/{job_id}/{action}").route(web::post().to(steer_job)));
}

/// A job to submit: a workflow of steps, and the first step's items.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobBody {
    /// Who the job is for: fairness is between users.
    #[schema(min_length = 1, max_length = 255)]
    user: String,
    /// Default `default`.
    #[schema(min_length = 1, max_length = 255)]
    tenant: Option<String>,
    /// Loki's actor path below the user, at most three names.
    #[serde(default)]
    #[schema(max_items = 3)]
    actor: Vec<String>,
    /// Synchronous jobs (false) go before the user's asynchronous ones.
    #[serde(default = "default_is_async")]
    #[schema(default = true)]
    is_async: bool,
    #[schema(min_items = 1)]
    steps: Vec<StepBody>,
    items: Vec<ItemBody>,
    /// Strategic metadata that claim strategies filter and count by: at most 16 keys of
    /// `[a-z0-9_.-]{1,64}`, each a string of 1 to 255 characters or an integer. (Read as any
    /// JSON, so that a bad shape gets invalid_metadata rather than invalid_body.)
    #[schema(value_type = Option<Object>)]
    metadata: Option<Value>,
    /// Higher goes first under the `priority` strategy: -1,000,000 to 1,000,000, default 0.
    #[schema(value_type = Option<i64>, minimum = -1000000, maximum = 1000000, default = 0)]
    priority: Option<Value>,
    /// How the items' retryable failures and expired leases are retried: `max_attempts` (1 to
    /// 100, the first attempt included), `backoff` (`none`: ready again at once; `fixed`:
    /// `initial` each time; `exponential`: initial × 2^(n−1) after the n-th failure, capped at
    /// `max`, with equal jitter, between half and all of that), `initial` and `max` (such as
    /// `2s`, `10m`; at most 7 days). A retry under a delay waits as `scheduled`, invisible to
    /// claims, until its time. Every field is optional: those left out take the broker's
    /// defaults (--retry-backoff, --retry-initial, --retry-max; max_attempts: --max-retries
    /// plus one). Without `retry`: up to --max-retries retries, each ready again at once.
    /// (Read as any JSON, so that a bad shape gets invalid_retry naming the field.)
    #[schema(value_type = Option<fairway_api::retry::RetryDocument>)]
    retry: Option<Value>,
    /// An RFC 3339 time before which no item of the job is handed out: its items begin
    /// `scheduled` (a time already past: ready at once), as do items appended before then.
    #[schema(value_type = Option<String>, format = DateTime, example = "2030-01-01T00:00:00Z")]
    not_before: Option<Value>,
}

fn default_is_async() -> bool {
    true
}

/// One step of the workflow.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    /// Characters of `[A-Za-z0-9._:/@-]`.
    #[schema(min_length = 1, max_length = 255, pattern = "^[A-Za-z0-9._:/@-]+$")]
    service: String,
    /// One item whose inputs are every result of the step before, once it has finished.
    #[serde(default)]
    aggregate: bool,
}

/// A work item of the first step.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemBody {
    /// Any JSON, handed to the worker as it is.
    #[serde(default)]
    payload: Value,
    /// The query component the item needs; default `unknown`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    component: Option<String>,
}

impl ItemBody {
    fn validate(self) -> Result<NewItem, ApiError> {
        let component = match self.component {
            Some(name) => ComponentName::parse(&name)?,
            None => ComponentName::default(),
        };
        Ok(NewItem { payload: self.payload, component })
    }
}

fn validate_items(items: Vec<ItemBody>) -> Result<Vec<NewItem>, ApiError> {
    items.into_iter().map(ItemBody::validate).collect()
}

impl JobBody {
    fn validate(self) -> Result<NewJob, ApiError> {
        let steps = self
            .steps
            .into_iter()
            .map(|step| {
                Ok(StepSpec {
                    service: ServiceName::parse(&step.service)?,
                    aggregate: step.aggregate,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let tenant = match self.tenant {
            Some(name) => TenantName::parse(&name)?,
            None => TenantName::default(),
        };
        let metadata = self.metadata.as_ref().map(Metadata::parse).transpose()?;
        let priority = self.priority.as_ref().map(parse_priority).transpose()?;
        let retry = self.retry.as_ref().map(RetrySpec::parse).transpose()?;
        let not_before = self.not_before.as_ref().map(parse_not_before).transpose()?;
        let mut job = NewJob::new(
            UserName::parse(&self.user)?,
            tenant,
            ActorPath::parse(&self.actor)?,
            self.is_async,
            steps,
            validate_items(self.items)?,
        )?;
        job.metadata = metadata.unwrap_or_default();
        job.priority = priority.unwrap_or(0);
        job.retry = retry;
        job.not_before = not_before;
        Ok(job)
    }
}

/// A submission's not_before: an RFC 3339 time with its offset.
fn parse_not_before(value: &Value) -> Result<DateTime<Utc>, ApiError> {
    let invalid = |why: &str| {
        ApiError::bad_request(
            "invalid_not_before",
            format!("not_before: {why}; write an RFC 3339 time such as \"2030-01-01T00:00:00Z\""),
        )
    };
    let text = value.as_str().ok_or_else(|| invalid("must be a string"))?;
    let time = DateTime::parse_from_rfc3339(text).map_err(|error| invalid(&error.to_string()))?;
    Ok(time.with_timezone(&Utc))
}

/// The answer to a submission.
#[derive(Serialize, ToSchema)]
pub struct Submitted {
    job_id: JobId,
    /// Always `accepted`.
    status: JobStatus,
}

/// The request header that makes a submission idempotent.
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The Idempotency-Key header, if any: 1 to 255 printable ASCII characters (space to `~`).
fn idempotency_key(request: &HttpRequest) -> Result<Option<String>, ApiError> {
    let Some(value) = request.headers().get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1 to 255 printable ASCII characters",
        )
    };
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 255 || !bytes.iter().all(|b| (b' '..=b'~').contains(b)) {
        return Err(invalid());
    }
    let key = std::str::from_utf8(bytes).map_err(|_| invalid())?;
    Ok(Some(key.to_owned()))
}

/// The `traceparent` header, if any: the producer's trace, which the job's workers continue.
fn traceparent(request: &HttpRequest) -> Result<Option<TraceParent>, ApiError> {
    let Some(value) = request.headers().get(crate::TRACEPARENT) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        ApiError::bad_request("invalid_traceparent", "traceparent must be printable ASCII")
    })?;
    Ok(Some(TraceParent::parse(text)?))
}

/// Submit a job. With an `Idempotency-Key` header, the same request sent again with the same
/// key (within --idempotency-ttl) gets the first answer, with `Idempotent-Replayed: true`, and
/// creates nothing.
#[utoipa::path(post, path = "/jobs", tag = "producers", request_body = JobBody,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "1 to 255 printable ASCII characters; scoped to the token (auth off: to the job's user)."),
        ("traceparent" = Option<String>, Header,
        description = "A W3C Trace Context traceparent (`00-<trace id>-<span id>-<flags>`): stored with the job and handed to its workers with each item, so that they continue the producer's trace.")),
    responses(
    (status = 201, description = "Stored; its items are ready. Or, with `Idempotent-Replayed: true`, the first answer to this key.", body = Submitted),
    (status = 400, description = "An invalid body, Idempotency-Key or traceparent; nothing was stored.", body = ErrorBody),
    (status = 409, description = "`idempotency_key_reused`: the key was used with another request; nothing was stored.", body = ErrorBody),
    (status = 429, description = "The tenant's waiting items would pass its max_outstanding; nothing was stored.", body = ErrorBody),
))]
async fn submit_job(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    request: HttpRequest,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let key = idempotency_key(&request)?;
    let traceparent = traceparent(&request)?;
    let body = body.into_inner();
    let mut job = serde_json::from_value::<JobBody>(body.clone())
        .map_err(|error| crate::error::invalid_body(&error))?
        .validate()?;
    job.traceparent = traceparent;
    check_tenant(&principal, job.tenant.as_str())?;
    let Some(key) = key else {
        let job_id = broker.jobs().submit_job(&job).await?;
        return Ok(HttpResponse::Created().json(Submitted { job_id, status: JobStatus::Accepted }));
    };
    let scope = match principal.token_id() {
        Some(token) => format!("token:{token}"),
        None => format!("user:{}", job.user.as_str()),
    };
    let key = IdempotencyKey::new(scope, key, &body);
    match broker.jobs().submit_job_keyed(&job, &key).await? {
        Submission::Created(job_id) => {
            Ok(HttpResponse::Created().json(Submitted { job_id, status: JobStatus::Accepted }))
        }
        Submission::Replayed { response, .. } => Ok(HttpResponse::Created()
            .insert_header(("Idempotent-Replayed", "true"))
            .json(response)),
    }
}

/// Items to add to the first step of an unfinished job.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemsBody {
    items: Vec<ItemBody>,
}

/// Add items to the first step of an unfinished job.
#[utoipa::path(post, path = "/jobs/{job_id}/items", tag = "producers", request_body = ItemsBody,
    params(("job_id" = Uuid, Path, description = "The job")),
    responses(
        (status = 200, description = "The job as it is now.", body = JobDocument),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job has finished, or its aggregating step has its item.", body = ErrorBody),
        (status = 429, description = "Over the tenant's max_outstanding; nothing was stored.", body = ErrorBody),
))]
async fn append_items(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<Uuid>,
    body: web::Json<ItemsBody>,
) -> Result<HttpResponse, ApiError> {
    let items = validate_items(body.into_inner().items)?;
    let job_id = JobId(path.into_inner());
    check_job(&broker, &principal, job_id).await?;
    let job = broker.jobs().append_items(job_id, &items).await?;
    Ok(HttpResponse::Ok().json(job))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct JobQuery {
    /// Seconds to wait for the job to finish (0 to 60, default 0: answer at once).
    #[param(value_type = Option<u32>, minimum = 0, maximum = 60)]
    wait: Option<String>,
}

/// A job's status, progress and per-step counts; with `wait`, once the job has finished
/// (successful, complete_with_errors, failed or canceled) or `wait` seconds have passed,
/// whichever comes first.
#[utoipa::path(get, path = "/jobs/{job_id}", tag = "producers",
    params(("job_id" = Uuid, Path, description = "The job"), JobQuery),
    responses(
        (status = 200, description = "The job.", body = JobDocument),
        (status = 404, description = "No such job, or it was pruned.", body = ErrorBody),
))]
async fn get_job(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<Uuid>,
    query: crate::query::Query<JobQuery>,
) -> Result<HttpResponse, ApiError> {
    let job_id = JobId(path.into_inner());
    let wait: u64 = number("wait", non_empty(&query.wait))?.unwrap_or(0);
    if wait > MAX_WAIT_SECONDS {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("wait must be between 0 and {MAX_WAIT_SECONDS} seconds"),
        ));
    }
    check_job(&broker, &principal, job_id).await?;
    let job = if wait == 0 {
        broker.jobs().get_job(job_id).await?
    } else {
        broker.jobs().wait_for_job(job_id, Duration::from_secs(wait)).await?
    };
    Ok(HttpResponse::Ok().json(job))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ResultsQuery {
    /// Most items of each list in a page (1 to 10,000, default 1,000).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The `next_cursor` of the page before; empty or absent: from the start.
    cursor: Option<String>,
}

/// The results of the job's last step, in item order, and the errors of its items that failed
/// for good, a page at a time.
#[utoipa::path(get, path = "/jobs/{job_id}/results", tag = "producers",
    params(("job_id" = Uuid, Path, description = "The job"), ResultsQuery),
    responses(
        (status = 200, description = "A page of results and errors.", body = ResultsPage),
        (status = 404, description = "No such job, or it was pruned.", body = ErrorBody),
))]
async fn job_results(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<Uuid>,
    query: crate::query::Query<ResultsQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = page_limit(non_empty(&query.limit))?;
    let cursor = non_empty(&query.cursor).map(ResultsCursor::parse).transpose()?;
    let job_id = JobId(path.into_inner());
    check_job(&broker, &principal, job_id).await?;
    let page = broker.jobs().job_results(job_id, cursor.unwrap_or_default(), limit).await?;
    Ok(HttpResponse::Ok().json(page))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ItemsQuery {
    /// Only this step's items.
    #[param(value_type = Option<i32>, minimum = 0)]
    step: Option<String>,
    /// Only items of this status.
    #[param(value_type = Option<ItemStatus>)]
    status: Option<String>,
    /// Most items in a page (1 to 10,000, default 1,000).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The `next_cursor` of the page before; empty or absent: from the start.
    cursor: Option<String>,
}

/// The job's items in the order they were made, optionally of one step and one status, a page
/// at a time.
#[utoipa::path(get, path = "/jobs/{job_id}/items", tag = "producers",
    params(("job_id" = Uuid, Path, description = "The job"), ItemsQuery),
    responses(
        (status = 200, description = "A page of items.", body = ItemsPage),
        (status = 404, description = "No such job, or it was pruned.", body = ErrorBody),
))]
async fn list_items(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<Uuid>,
    query: crate::query::Query<ItemsQuery>,
) -> Result<HttpResponse, ApiError> {
    let step: Option<i32> = number("step", non_empty(&query.step))?;
    if step.is_some_and(|step| step < 0) {
        return Err(ApiError::bad_request("invalid_query", "step must be 0 or more"));
    }
    let status = non_empty(&query.status).map(ItemStatus::parse).transpose()?;
    let limit = page_limit(non_empty(&query.limit))?;
    let cursor = non_empty(&query.cursor).map(ItemsCursor::parse).transpose()?;
    let filter = ItemFilter { step, status };
    let job_id = JobId(path.into_inner());
    check_job(&broker, &principal, job_id).await?;
    let page = broker.jobs().job_items(job_id, filter, cursor.unwrap_or_default(), limit).await?;
    Ok(HttpResponse::Ok().json(page))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct JobsQuery {
    /// This user's jobs (with `tenant`, only those in that tenant).
    #[param(max_length = 255)]
    user: Option<String>,
    /// This tenant's jobs. One of `user` and `tenant` is required.
    #[param(max_length = 255)]
    tenant: Option<String>,
    /// Only jobs of this status.
    #[param(value_type = Option<JobStatus>)]
    status: Option<String>,
    /// Only jobs with a step on this service.
    #[param(max_length = 255)]
    service: Option<String>,
    /// Only jobs submitted before this time (RFC 3339, e.g. `2026-11-25T00:00:00Z`).
    #[param(value_type = Option<String>, format = DateTime)]
    submitted_before: Option<String>,
    /// Most jobs in a page (1 to 10,000, default 1,000).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The `next_cursor` of the page before; empty or absent: from the newest.
    cursor: Option<String>,
}

/// A user's or a tenant's jobs, newest first, a page at a time. The filters mean what they mean
/// to `POST /admin/jobs/{action}`.
#[utoipa::path(get, path = "/jobs", tag = "producers", params(JobsQuery),
    responses((status = 200, description = "A page of jobs.", body = JobsPage)))]
async fn list_jobs(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    query: crate::query::Query<JobsQuery>,
) -> Result<HttpResponse, ApiError> {
    let mut tenant = non_empty(&query.tenant).map(TenantName::parse).transpose()?;
    // A token scoped to tenants lists one of them: the one named, or its only one.
    match (&tenant, principal.tenants()) {
        (Some(tenant), _) => check_tenant(&principal, tenant.as_str())?,
        (None, Some([only])) => tenant = Some(TenantName::parse(only)?),
        (None, Some(_)) => {
            return Err(ApiError::forbidden(
                "tenant_out_of_scope",
                "this token may list only some tenants' jobs: name one with tenant=",
            ))
        }
        (None, None) => {}
    }
    let owner = match (non_empty(&query.user), tenant) {
        (Some(user), tenant) => JobOwner::User { user: UserName::parse(user)?, tenant },
        (None, Some(tenant)) => JobOwner::Tenant(tenant),
        (None, None) => {
            return Err(ApiError::bad_request(
                "invalid_query",
                "name a user or a tenant (or both) whose jobs to list",
            ))
        }
    };
    let filter = JobsFilter {
        status: non_empty(&query.status).map(JobStatus::parse).transpose()?,
        service: non_empty(&query.service).map(ServiceName::parse).transpose()?,
        submitted_before: non_empty(&query.submitted_before).map(submission_time).transpose()?,
    };
    let limit = page_limit(non_empty(&query.limit))?;
    let cursor = non_empty(&query.cursor).map(JobsCursor::parse).transpose()?;
    let page = broker.jobs().list_jobs(&owner, &filter, cursor, limit).await?;
    Ok(HttpResponse::Ok().json(page))
}

/// `submitted_before`, an RFC 3339 time as the bulk actions' filter takes it.
fn submission_time(value: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(value).map(|at| at.with_timezone(&Utc)).map_err(|error| {
        let example = "2026-11-25T00:00:00Z";
        ApiError::bad_request(
            "invalid_query",
            format!(
                "submitted_before={value:?} is not an RFC 3339 time such as {example}: {error}"
            ),
        )
    })
}

/// What a producer can do to a whole job.
#[derive(Deserialize, Clone, Copy, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    Pause,
    Resume,
    Cancel,
}

/// Pause a job (items stay put, running ones finish), resume it, or cancel every unfinished
/// item.
#[utoipa::path(post, path = "/jobs/{job_id}/{action}", tag = "producers",
    params(
        ("job_id" = Uuid, Path, description = "The job"),
        ("action" = JobAction, Path, description = "What to do"),
    ),
    responses(
        (status = 200, description = "The job as it is now.", body = JobDocument),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job has finished.", body = ErrorBody),
))]
async fn steer_job(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<(Uuid, JobAction)>,
) -> Result<HttpResponse, ApiError> {
    let (job_id, action) = path.into_inner();
    let job_id = JobId(job_id);
    check_job(&broker, &principal, job_id).await?;
    let job = match action {
        JobAction::Pause => broker.jobs().pause_job(job_id).await?,
        JobAction::Resume => broker.jobs().resume_job(job_id).await?,
        JobAction::Cancel => broker.jobs().cancel_job(job_id).await?,
    };
    Ok(HttpResponse::Ok().json(job))
}

/// A job after a retry: its document, and how many items went back to ready.
#[derive(Serialize, ToSchema)]
pub struct RetriedBody {
    #[serde(flatten)]
    job: JobDocument,
    /// How many items that had failed for good are ready again.
    retried: i64,
}

/// Put every item of the job that failed for good back to ready, at its next attempt and with
/// a fresh retry budget; the job runs again.
#[utoipa::path(post, path = "/jobs/{job_id}/retry", tag = "producers",
    params(("job_id" = Uuid, Path, description = "The job")),
    responses(
        (status = 200, description = "The job as it is now, and how many items were retried.",
            body = RetriedBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "Nothing failed (`nothing_to_retry`), the job was \
            canceled (`job_canceled`), or an aggregating step already ran over the failed \
            items' step (`aggregation_started`).", body = ErrorBody),
))]
async fn retry_job(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let job_id = JobId(path.into_inner());
    check_job(&broker, &principal, job_id).await?;
    let retried = broker.jobs().retry_job(job_id).await?;
    Ok(HttpResponse::Ok().json(RetriedBody { job: retried.job, retried: retried.retried }))
}

/// For a token scoped to tenants: the job's 404 unless it is one of theirs, as if another
/// tenant's job did not exist. Unscoped callers pay nothing.
async fn check_job(broker: &Broker, principal: &Principal, job_id: JobId) -> Result<(), ApiError> {
    if principal.tenants().is_none() {
        return Ok(());
    }
    broker.jobs().check_job_tenant(job_id, |tenant| principal.may_use_tenant(tenant)).await?;
    Ok(())
}
