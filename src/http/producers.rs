//! Producers submit jobs and steer them.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::endpoint;
use super::error::ApiError;
use crate::broker::model::{
    ActorPath, ComponentName, JobId, NewItem, NewJob, ServiceName, StepSpec, TenantName, UserName,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobBody {
    user: String,
    tenant: Option<String>,
    #[serde(default)]
    actor: Vec<String>,
    #[serde(default = "default_is_async")]
    is_async: bool,
    steps: Vec<StepBody>,
    items: Vec<ItemBody>,
}

fn default_is_async() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepBody {
    service: String,
    #[serde(default)]
    aggregate: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    #[serde(default)]
    payload: Value,
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

async fn submit_job(
    broker: web::Data<Broker>,
    body: web::Json<JobBody>,
) -> Result<HttpResponse, ApiError> {
    let job = body.into_inner().validate()?;
    let job_id = broker.submit_job(&job).await?;
    Ok(HttpResponse::Created().json(json!({ "job_id": job_id, "status": "accepted" })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemsBody {
    items: Vec<ItemBody>,
}

async fn append_items(
    broker: web::Data<Broker>,
    path: web::Path<Uuid>,
    body: web::Json<ItemsBody>,
) -> Result<HttpResponse, ApiError> {
    let items = validate_items(body.into_inner().items)?;
    let job = broker.append_items(JobId(path.into_inner()), &items).await?;
    Ok(HttpResponse::Ok().json(job))
}

async fn get_job(
    broker: web::Data<Broker>,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let job = broker.get_job(JobId(path.into_inner())).await?;
    Ok(HttpResponse::Ok().json(job))
}

/// What a producer can do to a whole job.
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum JobAction {
    Pause,
    Resume,
    Cancel,
}

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
