//! Producers submit jobs and steer them.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::endpoint;
use super::error::{ApiError, ErrorBody};
use crate::broker::model::{
    ActorPath, ComponentName, JobDocument, JobId, JobStatus, NewItem, NewJob, ServiceName,
    StepSpec, TenantName, UserName,
};
use crate::broker::Broker;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(endpoint("/jobs").route(web::post().to(submit_job)))
        .service(endpoint("/jobs/{job_id}").route(web::get().to(get_job)))
        .service(endpoint("/jobs/{job_id}/items").route(web::post().to(append_items)))
        // After /items: routes match in the order they are registered.
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
        Ok(NewJob::new(
            UserName::parse(&self.user)?,
            tenant,
            ActorPath::parse(&self.actor)?,
            self.is_async,
            steps,
            validate_items(self.items)?,
        )?)
    }
}

/// The answer to a submission.
#[derive(Serialize, ToSchema)]
pub struct Submitted {
    job_id: JobId,
    /// Always `accepted`.
    status: JobStatus,
}

/// Submit a job.
#[utoipa::path(post, path = "/jobs", tag = "producers", request_body = JobBody, responses(
    (status = 201, description = "Stored; its items are ready.", body = Submitted),
    (status = 429, description = "The tenant's waiting items would pass its max_outstanding; nothing was stored.", body = ErrorBody),
))]
async fn submit_job(
    broker: web::Data<Broker>,
    body: web::Json<JobBody>,
) -> Result<HttpResponse, ApiError> {
    let job = body.into_inner().validate()?;
    let job_id = broker.submit_job(&job).await?;
    Ok(HttpResponse::Created().json(Submitted { job_id, status: JobStatus::Accepted }))
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
    path: web::Path<Uuid>,
    body: web::Json<ItemsBody>,
) -> Result<HttpResponse, ApiError> {
    let items = validate_items(body.into_inner().items)?;
    let job = broker.append_items(JobId(path.into_inner()), &items).await?;
    Ok(HttpResponse::Ok().json(job))
}

/// A job's status, progress and per-step counts.
#[utoipa::path(get, path = "/jobs/{job_id}", tag = "producers",
    params(("job_id" = Uuid, Path, description = "The job")),
    responses(
        (status = 200, description = "The job.", body = JobDocument),
        (status = 404, description = "No such job.", body = ErrorBody),
))]
async fn get_job(
    broker: web::Data<Broker>,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let job = broker.get_job(JobId(path.into_inner())).await?;
    Ok(HttpResponse::Ok().json(job))
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
    path: web::Path<(Uuid, JobAction)>,
) -> Result<HttpResponse, ApiError> {
    let (job_id, action) = path.into_inner();
    let job_id = JobId(job_id);
    let job = match action {
        JobAction::Pause => broker.pause_job(job_id).await?,
        JobAction::Resume => broker.resume_job(job_id).await?,
        JobAction::Cancel => broker.cancel_job(job_id).await?,
    };
    Ok(HttpResponse::Ok().json(job))
}
