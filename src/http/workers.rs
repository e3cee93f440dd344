//! Worker pods ask for work and report on it.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::endpoint;
use super::error::ApiError;
use crate::broker::model::{
    ClaimRequest, ComponentName, QuerierName, ServiceName, StatusUpdate, WorkItemId,
};
use crate::broker::Broker;

const MAX_WORKER_SLOT: u32 = 1023;
const MAX_WAIT_SECONDS: u32 = 60;
const MAX_BATCH: u32 = 100;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(endpoint("/work").route(web::get().to(get_work)))
        .service(endpoint("/work/{id}/status").route(web::post().to(post_status)))
        .service(endpoint("/queriers/{querier}/shutdown").route(web::post().to(shut_down)));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkQuery {
    service: String,
    querier: String,
    #[serde(default)]
    worker: u32,
    #[serde(default)]
    wait: u32,
    #[serde(default = "one")]
    max: u32,
}

fn one() -> u32 {
    1
}

fn out_of_range(name: &str, low: u32, high: u32) -> ApiError {
    ApiError::bad_request("invalid_query", format!("{name} must be between {low} and {high}"))
}

async fn get_work(
    broker: web::Data<Broker>,
    query: web::Query<WorkQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    if query.worker > MAX_WORKER_SLOT {
        return Err(out_of_range("worker", 0, MAX_WORKER_SLOT));
    }
    if query.wait > MAX_WAIT_SECONDS {
        return Err(out_of_range("wait", 0, MAX_WAIT_SECONDS));
    }
    if !(1..=MAX_BATCH).contains(&query.max) {
        return Err(out_of_range("max", 1, MAX_BATCH));
    }
    let request = ClaimRequest {
        service: ServiceName::parse(&query.service)?,
        querier: QuerierName::parse(&query.querier)?,
        // Both bounded by the checks above.
        worker: query.worker as i32,
        max: query.max as usize,
    };
    let items = broker.claim_waiting(&request, Duration::from_secs(u64::from(query.wait))).await?;
    if items.is_empty() {
        return Ok(HttpResponse::NoContent().finish());
    }
    Ok(HttpResponse::Ok().json(json!({ "work_items": items })))
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReportedStatus {
    Successful,
    Failed,
    Running,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusBody {
    status: ReportedStatus,
    attempt: i32,
    results: Option<Vec<Value>>,
    /// The component of the items made from `results`, when not this item's own.
    component: Option<String>,
    error: Option<String>,
    retryable: Option<bool>,
}

impl StatusBody {
    fn validate(self) -> Result<StatusUpdate, ApiError> {
        if self.results.is_some() && !matches!(self.status, ReportedStatus::Successful) {
            return Err(ApiError::bad_request(
                "invalid_body",
                "results are only accepted with status \"successful\"",
            ));
        }
        if self.component.is_some() && !matches!(self.status, ReportedStatus::Successful) {
            return Err(ApiError::bad_request(
                "invalid_body",
                "component is only accepted with status \"successful\"",
            ));
        }
        if self.retryable.is_some() && !matches!(self.status, ReportedStatus::Failed) {
            return Err(ApiError::bad_request(
                "invalid_body",
                "retryable is only accepted with status \"failed\"",
            ));
        }
        Ok(match self.status {
            ReportedStatus::Running => StatusUpdate::Running,
            ReportedStatus::Successful => StatusUpdate::Successful {
                results: self.results.unwrap_or_default(),
                component: self.component.as_deref().map(ComponentName::parse).transpose()?,
            },
            ReportedStatus::Failed => StatusUpdate::Failed {
                error: self.error,
                retryable: self.retryable.unwrap_or(true),
            },
        })
    }
}

async fn post_status(
    broker: web::Data<Broker>,
    path: web::Path<i64>,
    body: web::Json<StatusBody>,
) -> Result<HttpResponse, ApiError> {
    let id = WorkItemId(path.into_inner());
    let attempt = body.attempt;
    let update = body.into_inner().validate()?;
    let status = broker.update_status(id, attempt, update).await?;
    Ok(HttpResponse::Ok().json(json!({ "id": id, "status": status })))
}

/// A querier going away: it gets no more work, and leaves its shards once its leases end.
async fn shut_down(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let querier = QuerierName::parse(&path.into_inner())?;
    broker.shut_down_querier(&querier).await?;
    Ok(HttpResponse::Accepted().json(json!({ "querier": querier, "state": "shutting_down" })))
}
