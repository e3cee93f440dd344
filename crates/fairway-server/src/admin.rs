//! What operators look at: the user_work table, the consistency check and health probes.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::{endpoint, non_empty, Traffic};
use crate::auth::{check_tenant, Caller};
use chrono::{DateTime, Utc};
use fairway_api::build::VersionDocument;
use fairway_api::model::{JobStatus, UserName};
use fairway_api::model::{
    Mismatch, ServiceName, StrategyUsage, TenantName, UserShare, UserWorkCursor, UserWorkRow,
};
use fairway_api::pages::PageLimit;
use fairway_api::policy::{PolicyChange, PolicyOf, ServicePolicyDocument, UserPolicyDocument};
use fairway_api::strategy::valid_key;
use fairway_api::summary::ServiceSummary;
use fairway_api::tenancy::{QuerierDocument, TenantChange, TenantDocument};
use fairway_broker::{Broker, BulkAction, JobFilter};

const DEFAULT_SHARES: i64 = 10;
const MAX_SHARES: i64 = 100;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(endpoint("/admin/user-work").route(web::get().to(user_work)))
        .service(endpoint("/admin/shares").route(web::get().to(shares)))
        .service(endpoint("/admin/services").route(web::get().to(services)))
        .service(endpoint("/admin/version").route(web::get().to(version)))
        .service(
            endpoint("/admin/services/{service}")
                .route(web::get().to(service_policy))
                .route(web::put().to(set_service_policy)),
        )
        .service(
            endpoint("/admin/users/{user}")
                .route(web::get().to(user_policy))
                .route(web::put().to(set_user_policy)),
        )
        .service(endpoint("/admin/consistency").route(web::get().to(consistency)))
        .service(endpoint("/admin/strategies/usage").route(web::get().to(strategy_usage)))
        .service(endpoint("/admin/waiting-workers").route(web::get().to(waiting_workers)))
        .service(endpoint("/admin/queriers").route(web::get().to(queriers)))
        .service(endpoint("/admin/tenants").route(web::get().to(tenants)))
        .service(
            endpoint("/admin/tenants/{tenant}")
                .route(web::get().to(tenant))
                .route(web::put().to(set_tenant)),
        )
        .service(endpoint("/admin/jobs/{action}").route(web::post().to(bulk_jobs)))
        .service(endpoint("/metrics").route(web::get().to(metrics)))
        .service(endpoint("/healthz").route(web::get().to(healthz)))
        .service(endpoint("/readyz").route(web::get().to(readyz)))
        .service(endpoint("/prestop").route(web::get().to(prestop)));
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UserWorkQuery {
    /// Only this service's rows; empty: every service.
    service: Option<String>,
    /// Only this user's rows; empty: every user.
    user: Option<String>,
    /// Most rows (default 1,000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
    /// The `next_cursor` of the page before; empty or absent: from the start.
    after: Option<String>,
}

/// A page of the user_work table.
#[derive(Serialize, ToSchema)]
pub struct UserWorkRows {
    rows: Vec<UserWorkRow>,
    /// Where the next page starts, when this one is full.
    next_cursor: Option<String>,
}

/// Rows of the user_work table: who has work where, in user and service order.
#[utoipa::path(get, path = "/admin/user-work", tag = "admin", params(UserWorkQuery),
    responses((status = 200, description = "The rows.", body = UserWorkRows)))]
async fn user_work(
    broker: web::Data<Broker>,
    query: crate::query::Query<UserWorkQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.map(PageLimit::new).transpose()?.unwrap_or_default();
    let after = non_empty(&query.after).map(UserWorkCursor::parse).transpose()?;
    let (service, user) = (non_empty(&query.service), non_empty(&query.user));
    let rows = broker.maintenance().user_work(service, user, limit.get(), after.as_ref()).await?;
    let next_cursor =
        rows.last().filter(|_| limit.filled_by(rows.len())).map(UserWorkCursor::after);
    Ok(HttpResponse::Ok().json(UserWorkRows { rows, next_cursor }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SharesQuery {
    /// The service.
    #[param(min_length = 1, max_length = 255, pattern = "^[A-Za-z0-9._:/@-]+$")]
    service: String,
    /// Most users (default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

/// Who shares a service's workers now.
#[derive(Serialize, ToSchema)]
pub struct Shares {
    service: String,
    users: Vec<UserShare>,
}

/// The users with the most running items of a service, with their ready items: each one's
/// share of the service's workers right now.
#[utoipa::path(get, path = "/admin/shares", tag = "admin", params(SharesQuery),
    responses((status = 200, description = "The users, most running first.", body = Shares)))]
async fn shares(
    broker: web::Data<Broker>,
    query: crate::query::Query<SharesQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let service = ServiceName::parse(&query.service)?;
    let limit = query.limit.unwrap_or(DEFAULT_SHARES);
    if !(1..=MAX_SHARES).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit must be between 1 and {MAX_SHARES}"),
        ));
    }
    let users = broker.maintenance().user_shares(service.as_str(), limit).await?;
    Ok(HttpResponse::Ok().json(Shares { service: query.service, users }))
}

/// Every service the broker has seen work for.
#[derive(Serialize, ToSchema)]
pub struct Services {
    services: Vec<ServiceSummary>,
}

/// Each service's queue: ready, running and paused items, the oldest ready item's age and
/// active users (the same numbers as `/metrics`, as fresh as `--metrics-refresh`), and this
/// broker's claims per second and waiting workers.
#[utoipa::path(get, path = "/admin/services", tag = "admin",
    responses((status = 200, description = "The services, by name.", body = Services)))]
async fn services(broker: web::Data<Broker>) -> HttpResponse {
    HttpResponse::Ok().json(Services { services: broker.maintenance().service_summaries().await })
}

/// A service's policy and its items running now.
#[utoipa::path(get, path = "/admin/services/{service}", tag = "admin",
    params(("service" = String, Path, description = "The service")),
    responses(
        (status = 200, description = "The service's policy.", body = ServicePolicyDocument),
        (status = 404, description = "No job names the service and it has no policy.", body = ErrorBody),
    ))]
async fn service_policy(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let service = ServiceName::parse(&path.into_inner())?;
    Ok(HttpResponse::Ok().json(broker.policies().service(&service).await?))
}

/// A change to a service's policy: the fields given; those left out keep their value.
// Only the OpenAPI document reads it: the body is parsed by PolicyChange::parse, which names
// the field at fault in its own words.
#[allow(dead_code)]
#[derive(ToSchema)]
pub struct ServicePolicyBody {
    /// Most items of the service running at once, over every broker; 0: no cap.
    #[schema(minimum = 0, maximum = 2147483647)]
    max_running: Option<i32>,
    /// Items handed out per second, over every broker; 0: no limit.
    #[schema(minimum = 0, maximum = 1000000)]
    rate_per_second: Option<f64>,
    /// Items handed out at once after a quiet spell: at most `burst + rate_per_second × t` in
    /// any t seconds.
    #[schema(minimum = 1, maximum = 1000000)]
    burst: Option<i32>,
}

/// Set a service's cap on running items and its rate limit, for a service not yet seen too;
/// every broker's claims obey it from their next batch.
#[utoipa::path(put, path = "/admin/services/{service}", tag = "admin",
    request_body = ServicePolicyBody,
    params(("service" = String, Path, description = "The service")),
    responses((status = 200, description = "The service's policy as it is now.", body = ServicePolicyDocument)))]
async fn set_service_policy(
    broker: web::Data<Broker>,
    path: web::Path<String>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let service = ServiceName::parse(&path.into_inner())?;
    let change = PolicyChange::parse(&body, PolicyOf::Service)?;
    Ok(HttpResponse::Ok().json(broker.policies().set_service(&service, change).await?))
}

/// A user's policy and its items running now, over every service.
#[utoipa::path(get, path = "/admin/users/{user}", tag = "admin",
    params(("user" = String, Path, description = "The user")),
    responses(
        (status = 200, description = "The user's policy.", body = UserPolicyDocument),
        (status = 404, description = "The user has no work and no policy.", body = ErrorBody),
    ))]
async fn user_policy(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let user = UserName::parse(&path.into_inner())?;
    Ok(HttpResponse::Ok().json(broker.policies().user(&user).await?))
}

/// A change to a user's policy: the fields given; those left out keep their value.
// Only the OpenAPI document reads it: the body is parsed by PolicyChange::parse.
#[allow(dead_code)]
#[derive(ToSchema)]
pub struct UserPolicyBody {
    /// The user's share of the workers against other backlogged users'; default 1.
    #[schema(minimum = 1, maximum = 1000)]
    weight: Option<i32>,
    /// Most items of the user running at once, over every broker and service; 0: no cap.
    #[schema(minimum = 0, maximum = 2147483647)]
    max_running: Option<i32>,
    /// Items handed out per second, over every broker; 0: no limit.
    #[schema(minimum = 0, maximum = 1000000)]
    rate_per_second: Option<f64>,
    /// Items handed out at once after a quiet spell: at most `burst + rate_per_second × t` in
    /// any t seconds.
    #[schema(minimum = 1, maximum = 1000000)]
    burst: Option<i32>,
}

/// Set a user's weight, cap on running items and rate limit, for a user not yet seen too;
/// every broker's claims obey it from their next batch.
#[utoipa::path(put, path = "/admin/users/{user}", tag = "admin",
    request_body = UserPolicyBody,
    params(("user" = String, Path, description = "The user")),
    responses((status = 200, description = "The user's policy as it is now.", body = UserPolicyDocument)))]
async fn set_user_policy(
    broker: web::Data<Broker>,
    path: web::Path<String>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let user = UserName::parse(&path.into_inner())?;
    let change = PolicyChange::parse(&body, PolicyOf::User)?;
    Ok(HttpResponse::Ok().json(broker.policies().set_user(&user, change).await?))
}

/// Every querier.
#[derive(Serialize, ToSchema)]
pub struct Queriers {
    queriers: Vec<QuerierDocument>,
}

/// Every tenant.
#[derive(Serialize, ToSchema)]
pub struct Tenants {
    tenants: Vec<TenantDocument>,
}

/// Each querier: state, last request, leases held, the sharded tenants it serves.
#[utoipa::path(get, path = "/admin/queriers", tag = "admin",
    responses((status = 200, description = "The queriers.", body = Queriers)))]
async fn queriers(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Queriers { queriers: broker.tenancy().queriers().await? }))
}

/// Every tenant's limits, waiting items and the queriers that serve it now.
#[utoipa::path(get, path = "/admin/tenants", tag = "admin",
    responses((status = 200, description = "The tenants.", body = Tenants)))]
async fn tenants(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Tenants { tenants: broker.tenancy().tenants().await? }))
}

/// One tenant's limits, waiting items and the queriers that serve it now.
#[utoipa::path(get, path = "/admin/tenants/{tenant}", tag = "admin",
    params(("tenant" = String, Path, description = "The tenant")),
    responses(
        (status = 200, description = "The tenant.", body = TenantDocument),
        (status = 404, description = "No such tenant.", body = ErrorBody),
))]
async fn tenant(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = TenantName::parse(&path.into_inner())?;
    Ok(HttpResponse::Ok().json(broker.tenancy().tenant(&tenant).await?))
}

/// A change to a tenant's limits and policy: the fields given; those left out keep their value.
// Only the OpenAPI document reads it: the body is parsed by TenantChange::parse.
#[allow(dead_code)]
#[derive(ToSchema)]
pub struct TenantBody {
    /// Queriers that serve the tenant; 0: all of them.
    #[schema(minimum = 0, maximum = 2147483647)]
    max_queriers: Option<i32>,
    /// Most ready items the tenant may have waiting; 0: no limit.
    #[schema(minimum = 0, maximum = 2147483647)]
    max_outstanding: Option<i32>,
    /// The tenant's share of the workers against other tenants'; default 1.
    #[schema(minimum = 1, maximum = 1000)]
    weight: Option<i32>,
    /// Most items of the tenant running at once, over every broker and service; 0: no cap.
    #[schema(minimum = 0, maximum = 2147483647)]
    max_running: Option<i32>,
    /// Items handed out per second, over every broker; 0: no limit.
    #[schema(minimum = 0, maximum = 1000000)]
    rate_per_second: Option<f64>,
    /// Items handed out at once after a quiet spell.
    #[schema(minimum = 1, maximum = 1000000)]
    burst: Option<i32>,
}

/// Set a tenant's limits and policy, creating it if needed; the shards are redrawn.
#[utoipa::path(put, path = "/admin/tenants/{tenant}", tag = "admin", request_body = TenantBody,
    params(("tenant" = String, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant as it is now.", body = TenantDocument)))]
async fn set_tenant(
    broker: web::Data<Broker>,
    path: web::Path<String>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let tenant = TenantName::parse(&path.into_inner())?;
    let change = TenantChange::parse(&body)?;
    Ok(HttpResponse::Ok().json(broker.tenancy().set_tenant(&tenant, change).await?))
}

/// What a bulk action does to each job it matches.
#[derive(Deserialize, Clone, Copy, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkJobAction {
    Pause,
    Resume,
    Cancel,
    Retry,
}

/// Which jobs a bulk action touches: every field given must match; at least one is required.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobFilterBody {
    user: Option<String>,
    tenant: Option<String>,
    /// One job status: accepted, running, paused, successful, complete_with_errors, failed
    /// or canceled.
    status: Option<String>,
    /// Jobs with a step on this service.
    service: Option<String>,
    /// Jobs submitted before this time.
    submitted_before: Option<DateTime<Utc>>,
    /// Count the jobs the filter matches and change none: `changed` is 0.
    #[serde(default)]
    dry_run: bool,
}

/// How many jobs a bulk action matched and changed.
#[derive(Serialize, ToSchema)]
pub struct BulkAnswer {
    matched: u64,
    changed: u64,
}

/// Pause, resume, cancel or retry every job the filter matches, each as its single-job route
/// would, one job per transaction. A producer token touches only its tenants' jobs. With
/// `dry_run`, only how many jobs the filter matches now, as a confirmation would show.
#[utoipa::path(post, path = "/admin/jobs/{action}", tag = "admin", request_body = JobFilterBody,
    params(("action" = BulkJobAction, Path, description = "What to do to each job")),
    responses(
        (status = 200, description = "How many jobs matched and changed.", body = BulkAnswer),
        (status = 403, description = "A tenant outside the token's scope.", body = ErrorBody),
))]
async fn bulk_jobs(
    broker: web::Data<Broker>,
    Caller(principal): Caller,
    path: web::Path<BulkJobAction>,
    body: web::Json<JobFilterBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let empty = body.user.is_none()
        && body.tenant.is_none()
        && body.status.is_none()
        && body.service.is_none()
        && body.submitted_before.is_none();
    if empty {
        return Err(ApiError::bad_request(
            "empty_filter",
            "name at least one of user, tenant, status, service and submitted_before",
        ));
    }
    let user = body.user.as_deref().map(UserName::parse).transpose()?;
    let tenant = body.tenant.as_deref().map(TenantName::parse).transpose()?;
    let service = body.service.as_deref().map(ServiceName::parse).transpose()?;
    let status = body.status.as_deref().map(JobStatus::parse).transpose()?;
    if let Some(tenant) = &tenant {
        check_tenant(&principal, tenant.as_str())?;
    }
    let filter = JobFilter {
        user: user.map(|user| user.as_str().to_owned()),
        tenant: tenant.map(|tenant| tenant.as_str().to_owned()),
        status,
        service: service.map(|service| service.as_str().to_owned()),
        submitted_before: body.submitted_before,
        tenants: principal.tenants().map(<[String]>::to_vec),
    };
    let action = match path.into_inner() {
        BulkJobAction::Pause => BulkAction::Pause,
        BulkJobAction::Resume => BulkAction::Resume,
        BulkJobAction::Cancel => BulkAction::Cancel,
        BulkJobAction::Retry => BulkAction::Retry,
    };
    if body.dry_run {
        let matched = broker.jobs().count_filtered(&filter).await?;
        return Ok(HttpResponse::Ok().json(BulkAnswer { matched, changed: 0 }));
    }
    let outcome = broker.jobs().bulk(action, &filter).await?;
    Ok(HttpResponse::Ok().json(BulkAnswer { matched: outcome.matched, changed: outcome.changed }))
}

/// A recount of every counter from the work items.
#[derive(Serialize, ToSchema)]
pub struct Consistency {
    consistent: bool,
    mismatches: Vec<Mismatch>,
}

/// Recount every counter from the work items and report each difference.
#[utoipa::path(get, path = "/admin/consistency", tag = "admin",
    responses((status = 200, description = "The recount.", body = Consistency)))]
async fn consistency(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    let mismatches = broker.maintenance().check_consistency().await?;
    Ok(HttpResponse::Ok().json(Consistency { consistent: mismatches.is_empty(), mismatches }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// The service whose items are counted.
    service: String,
    /// The metadata key whose values are listed: 1 to 64 characters of `[a-z0-9_.-]`.
    key: String,
}

/// Each value of a metadata key with its items of a service.
#[derive(Serialize, ToSchema)]
pub struct StrategyUsageReport {
    service: String,
    key: String,
    values: Vec<StrategyUsage>,
}

/// Each value of a metadata key, with its items of a service running (what max_simultaneous
/// and prefer_distinct count) and ready: a capped customer's state.
#[utoipa::path(get, path = "/admin/strategies/usage", tag = "admin", params(UsageQuery),
    responses((status = 200, description = "Each value with items.", body = StrategyUsageReport)))]
async fn strategy_usage(
    broker: web::Data<Broker>,
    query: crate::query::Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    let service = ServiceName::parse(&query.service)?;
    if !valid_key(&query.key) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "key must be 1 to 64 characters of [a-z0-9_.-]",
        ));
    }
    let values = broker.maintenance().strategy_usage(service.as_str(), &query.key).await?;
    let UsageQuery { service, key } = query.into_inner();
    Ok(HttpResponse::Ok().json(StrategyUsageReport { service, key, values }))
}

/// Workers long-polling this broker process, per service.
#[derive(Serialize, ToSchema)]
pub struct WaitingWorkers {
    services: BTreeMap<String, usize>,
}

/// Workers long-polling this broker process, per service: idle capacity.
#[utoipa::path(get, path = "/admin/waiting-workers", tag = "admin",
    responses((status = 200, description = "Per service.", body = WaitingWorkers)))]
async fn waiting_workers(broker: web::Data<Broker>) -> HttpResponse {
    HttpResponse::Ok().json(WaitingWorkers { services: broker.waiting_workers() })
}

/// Prometheus metrics, in the text exposition format; the queue gauges are at most
/// --metrics-refresh old.
#[utoipa::path(get, path = "/metrics", tag = "probes",
    responses((status = 200, description = "Every metric, in Prometheus' text format.",
        content_type = "text/plain", body = String)))]
async fn metrics(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    let text = broker.maintenance().metrics_text().await?;
    Ok(HttpResponse::Ok().content_type(fairway_broker::metrics::content_type()).body(text))
}

/// Which build this broker is: its release, the server-function revision and the last schema
/// migration it carries, and what the database holds of each.
#[utoipa::path(get, path = "/admin/version", tag = "admin",
    responses((status = 200, description = "This broker's build and its database's schema.", body = VersionDocument)))]
async fn version(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(broker.maintenance().version().await?))
}

/// A probe's answer.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `ready`.
    status: &'static str,
}

/// A Kubernetes preStop hook: /readyz answers 503 from now, and the answer comes after
/// --prestop-delay, while the broker goes on serving, so that the Service stops routing here
/// before SIGTERM starts the drain. Unlike a `sleep` hook it works on every Kubernetes
/// version. Should no SIGTERM follow, /readyz is 200 again a minute later.
#[utoipa::path(get, path = "/prestop", tag = "probes",
    responses((status = 200, description = "The delay passed; the broker may be stopped.", body = Health)))]
async fn prestop(traffic: web::Data<Traffic>, settings: web::Data<PrestopDelay>) -> HttpResponse {
    traffic.look_unready(settings.0);
    tracing::info!(delay = ?settings.0, "preStop: answering 503 on /readyz before the stop");
    tokio::time::sleep(settings.0).await;
    HttpResponse::Ok().json(Health { status: "stopping" })
}

/// --prestop-delay, as the handler reads it.
pub struct PrestopDelay(pub Duration);

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "probes",
    responses((status = 200, description = "Up.", body = Health)))]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// The database answers, and the broker is neither stopping nor about to.
#[utoipa::path(get, path = "/readyz", tag = "probes",
    responses(
        (status = 200, description = "Ready to serve.", body = Health),
        (status = 503, description = "Stopping, about to stop (GET /prestop), or the database does not take writes.", body = ErrorBody),
))]
async fn readyz(
    broker: web::Data<Broker>,
    traffic: web::Data<Traffic>,
) -> Result<HttpResponse, ApiError> {
    if broker.is_draining() || traffic.unready() {
        return Err(ApiError::ShuttingDown);
    }
    broker.ping().await?;
    Ok(HttpResponse::Ok().json(Health { status: "ready" }))
}
