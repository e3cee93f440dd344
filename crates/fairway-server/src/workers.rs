//! Worker pods ask for work and report on it.

use std::collections::BTreeSet;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::endpoint;
use super::error::{ApiError, ErrorBody};
use crate::auth::Caller;
use fairway_api::model::{
    ClaimRequest, ComponentName, ItemStatus, QuerierName, ServiceName, StatusUpdate, WorkItem,
    WorkItemId,
};
use fairway_api::strategy::Strategy;
use fairway_broker::Broker;

const MAX_WORKER_SLOT: u32 = 1023;
const MAX_WAIT_SECONDS: u32 = 60;
const MAX_BATCH: u32 = 100;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(endpoint("/work").route(web::get().to(get_work)))
        .service(endpoint("/work/{id}/status").route(web::post().to(post_status)))
        .service(endpoint("/queriers/{querier}/shutdown").route(web::post().to(shut_down)));
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct WorkQuery {
    /// The service whose work to take.
    #[param(min_length = 1, max_length = 255, pattern = "^[A-Za-z0-9._:/@-]+$")]
    service: String,
    /// The asking pod; tenant shards are drawn over queriers.
    #[param(min_length = 1, max_length = 255)]
    querier: String,
    /// The worker slot within the querier: where its component round robin starts.
    #[serde(default)]
    #[param(minimum = 0, maximum = 1023)]
    worker: u32,
    /// Seconds to wait for work to appear.
    #[serde(default)]
    #[param(minimum = 0, maximum = 60)]
    wait: u32,
    /// Most items to take, each chosen as fairly as a single claim.
    #[serde(default = "one")]
    #[param(minimum = 1, maximum = 100, default = 1)]
    max: u32,
    /// How this claim picks its items (docs/strategies.md); the fair order without.
    strategy: Option<String>,
}

/// Items handed out, leased to the asking worker.
#[derive(Serialize, ToSchema)]
pub struct WorkItems {
    work_items: Vec<WorkItem>,
}

fn one() -> u32 {
    1
}

fn out_of_range(name: &str, low: u32, high: u32) -> ApiError {
    ApiError::bad_request("invalid_query", format!("{name} must be between {low} and {high}"))
}

/// Claim work: up to `max` items of the service, chosen by the fair order.
#[utoipa::path(get, path = "/work", tag = "workers", params(WorkQuery), responses(
    (status = 200, description = "Items, each leased for --lease.", body = WorkItems),
    (status = 204, description = "No work came within `wait`.", headers(
        ("fairway-unknown-service" = String, description = "Present when no job has named the service (a typo?): the service, as asked for. Workers may start before the first job, so the answer is still 204."),
    )),
    (status = 410, description = "The querier announced its shutdown.", body = ErrorBody),
))]
async fn get_work(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    query: crate::query::Query<WorkQuery>,
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
    let service = ServiceName::parse(&query.service)?;
    if !principal.may_claim(service.as_str()) {
        return Err(ApiError::forbidden(
            "service_out_of_scope",
            format!("this token may not claim service {:?}'s work", service.as_str()),
        ));
    }
    let request = ClaimRequest {
        service,
        querier: QuerierName::parse(&query.querier)?,
        // Both bounded by the checks above.
        worker: query.worker as i32,
        max: query.max as usize,
        strategy: match query.strategy.as_deref() {
            Some(text) => Strategy::parse(text)?.to_claim_argument(),
            None => None,
        },
        token: principal.token_id(),
    };
    let items =
        broker.claims().claim_waiting(&request, Duration::from_secs(u64::from(query.wait))).await?;
    // A stopping broker starts no claim and ends its long polls: a 503 with Retry-After (and
    // the connection closed) sends the worker to another broker, where a 204 would have it ask
    // this one again at once.
    if items.is_empty() && broker.is_draining() {
        return Err(ApiError::ShuttingDown);
    }
    if items.is_empty() {
        let mut answer = HttpResponse::NoContent();
        // Workers may start before the first job, so a service no job has named still gets
        // 204; the header tells the worker, and the log the operator, that it may be a typo.
        match broker.claims().service_is_named(&request.service).await {
            Ok(true) => {}
            Ok(false) => {
                answer.insert_header((UNKNOWN_SERVICE, request.service.as_str()));
                log_unknown_service(request.service.as_str());
            }
            // The check only adds a hint: an answer with no work is still right without it.
            Err(error) => tracing::warn!(%error, "cannot tell whether the service is named"),
        }
        return Ok(answer.finish());
    }
    Ok(HttpResponse::Ok().json(WorkItems { work_items: items }))
}

/// The header on a 204 for a service that no job has named (docs/api.md).
const UNKNOWN_SERVICE: &str = "fairway-unknown-service";

/// Services a log line already named as unknown, so that a worker polling a typo all day
/// writes it once per broker. Bounded, as the names come from requests.
static UNKNOWN_SERVICES_LOGGED: std::sync::Mutex<BTreeSet<String>> =
    std::sync::Mutex::new(BTreeSet::new());
const MOST_UNKNOWN_SERVICES_LOGGED: usize = 1000;

fn log_unknown_service(service: &str) {
    let mut logged = match UNKNOWN_SERVICES_LOGGED.lock() {
        Ok(logged) => logged,
        Err(poisoned) => poisoned.into_inner(),
    };
    if logged.len() < MOST_UNKNOWN_SERVICES_LOGGED && logged.insert(service.to_owned()) {
        tracing::warn!(
            service,
            "a worker asks for work of a service that no job has named: a typo? It waits like \
             an idle service's workers (and gets the {UNKNOWN_SERVICE} header)"
        );
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportedStatus {
    Successful,
    Failed,
    Running,
    /// Handed back unworked: ready again at once, the attempt not counted.
    Released,
}

/// A worker's report on the attempt it holds.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusBody {
    /// `running` is a heartbeat that extends the lease.
    status: ReportedStatus,
    /// The attempt the item was handed out with.
    attempt: i32,
    /// With `successful`: the results, each becoming an item of the next step.
    results: Option<Vec<Value>>,
    /// With `successful`: the component of the items made from `results`, when not this
    /// item's own.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    component: Option<String>,
    /// With `failed`: what went wrong.
    error: Option<String>,
    /// With `failed`: whether the item may go again (default true).
    retryable: Option<bool>,
    /// With `released`: why the worker hands the item back, for operators.
    #[schema(max_length = 1000)]
    reason: Option<String>,
    /// With `successful`: what the worker warns of though it succeeded (no data in a
    /// granule, say), kept on the item.
    #[schema(max_length = 1000)]
    warning: Option<String>,
}

/// Longest reason a release, or warning a success, may give, in characters.
const MAX_TEXT_CHARS: usize = 1000;

/// An item's status after a report.
#[derive(Serialize, ToSchema)]
pub struct StatusAnswer {
    id: WorkItemId,
    status: ItemStatus,
    /// After a heartbeat (`running`): when the lease now ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_at: Option<DateTime<Utc>>,
}

/// A querier's state after its shutdown notice.
#[derive(Serialize, ToSchema)]
pub struct ShutdownAnswer {
    querier: String,
    /// Always `shutting_down`.
    state: String,
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
        if self.reason.is_some() && !matches!(self.status, ReportedStatus::Released) {
            return Err(ApiError::bad_request(
                "invalid_body",
                "reason is only accepted with status \"released\"",
            ));
        }
        if self.warning.is_some() && !matches!(self.status, ReportedStatus::Successful) {
            return Err(ApiError::bad_request(
                "invalid_body",
                "warning is only accepted with status \"successful\"",
            ));
        }
        for (field, text) in [("reason", &self.reason), ("warning", &self.warning)] {
            if text.as_ref().is_some_and(|text| text.chars().count() > MAX_TEXT_CHARS) {
                return Err(ApiError::bad_request(
                    "invalid_body",
                    format!("{field} is longer than {MAX_TEXT_CHARS} characters"),
                ));
            }
        }
        Ok(match self.status {
            ReportedStatus::Running => StatusUpdate::Running,
            ReportedStatus::Successful => StatusUpdate::Successful {
                results: self.results.unwrap_or_default(),
                component: self.component.as_deref().map(ComponentName::parse).transpose()?,
                warning: self.warning,
            },
            ReportedStatus::Failed => StatusUpdate::Failed {
                error: self.error,
                retryable: self.retryable.unwrap_or(true),
            },
            ReportedStatus::Released => StatusUpdate::Released { reason: self.reason },
        })
    }
}

/// Report on an attempt: done, failed, still running, or handed back unworked (`released`).
#[utoipa::path(post, path = "/work/{id}/status", tag = "workers", request_body = StatusBody,
    params(("id" = i64, Path, description = "The work item")),
    responses(
        (status = 200, description = "Applied; or the same report (attempt, status, results or error) was applied before and this is it sent again: the same answer, nothing changed.", body = StatusAnswer),
        (status = 404, description = "No such item.", body = ErrorBody),
        (status = 403, description = "A worker token's report on an attempt another token claimed; nothing changed.", body = ErrorBody),
        (status = 409, description = "The attempt is no longer current, or the item has finished (and this is not the report that ended it).", body = ErrorBody),
        (status = 503, description = "The database kept aborting the update's transaction (deadlocks); nothing changed. Send it again after Retry-After.", body = ErrorBody),
))]
async fn post_status(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<i64>,
    body: web::Json<StatusBody>,
) -> Result<HttpResponse, ApiError> {
    let id = WorkItemId(path.into_inner());
    let attempt = body.attempt;
    let update = body.into_inner().validate()?;
    let token = principal.reporting_token();
    let answer = match update {
        StatusUpdate::Running => StatusAnswer {
            id,
            status: ItemStatus::Running,
            lease_expires_at: Some(broker.endings().heartbeat(id, attempt, token).await?),
        },
        update => StatusAnswer {
            id,
            status: broker.endings().update_status(id, attempt, update, token).await?,
            lease_expires_at: None,
        },
    };
    Ok(HttpResponse::Ok().json(answer))
}

/// A querier going away: it gets no more work, and leaves its shards once its leases end. Once
/// it holds no lease and has not been heard for the forget delay (its 410s do not count), it is
/// forgotten, and a pod that kept its name across a restart joins afresh.
#[utoipa::path(post, path = "/queriers/{querier}/shutdown", tag = "workers",
    params(("querier" = String, Path, description = "The querier")),
    responses(
        (status = 202, description = "It gets 410 until it holds no lease and has not been heard for the forget delay; then it is forgotten and may join again.", body = ShutdownAnswer),
        (status = 404, description = "No such querier: it never asked for work, or was forgotten.", body = ErrorBody),
    ),
)]
async fn shut_down(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let querier = QuerierName::parse(&path.into_inner())?;
    broker.tenancy().shut_down_querier(&querier).await?;
    let state = "shutting_down".to_owned();
    Ok(HttpResponse::Accepted()
        .json(ShutdownAnswer { querier: querier.as_str().to_owned(), state }))
}
