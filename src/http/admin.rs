//! What operators look at: the user_work table, the consistency check and health probes.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::endpoint;
use super::error::ApiError;
use crate::broker::membership::TenantLimits;
use crate::broker::model::TenantName;
use crate::broker::Broker;

const DEFAULT_ROWS: i64 = 1000;
const MAX_ROWS: i64 = 10_000;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(endpoint("/admin/user-work").route(web::get().to(user_work)))
        .service(endpoint("/admin/consistency").route(web::get().to(consistency)))
        .service(endpoint("/admin/waiting-workers").route(web::get().to(waiting_workers)))
        .service(endpoint("/admin/queriers").route(web::get().to(queriers)))
        .service(endpoint("/admin/tenants").route(web::get().to(tenants)))
        .service(
            endpoint("/admin/tenants/{tenant}")
                .route(web::get().to(tenant))
                .route(web::put().to(set_tenant)),
        )
        .service(endpoint("/healthz").route(web::get().to(healthz)))
        .service(endpoint("/readyz").route(web::get().to(readyz)));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserWorkQuery {
    service: Option<String>,
    user: Option<String>,
    limit: Option<i64>,
}

async fn user_work(
    broker: web::Data<Broker>,
    query: web::Query<UserWorkQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_ROWS);
    if !(1..=MAX_ROWS).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit must be between 1 and {MAX_ROWS}"),
        ));
    }
    let rows = broker.user_work(non_empty(&query.service), non_empty(&query.user), limit).await?;
    Ok(HttpResponse::Ok().json(json!({ "rows": rows })))
}

/// An empty filter means no filter, so `?service=&user=` lists everything.
fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|value| !value.is_empty())
}

async fn queriers(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(json!({ "queriers": broker.queriers().await? })))
}

async fn tenants(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(json!({ "tenants": broker.tenants().await? })))
}

async fn tenant(
    broker: web::Data<Broker>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = TenantName::parse(&path.into_inner())?;
    Ok(HttpResponse::Ok().json(broker.tenant(&tenant).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantBody {
    max_queriers: u32,
    max_outstanding: u32,
}

async fn set_tenant(
    broker: web::Data<Broker>,
    path: web::Path<String>,
    body: web::Json<TenantBody>,
) -> Result<HttpResponse, ApiError> {
    let tenant = TenantName::parse(&path.into_inner())?;
    let limit = |name: &str, value: u32| {
        i32::try_from(value).map_err(|_| {
            ApiError::bad_request("invalid_body", format!("{name} must be at most {}", i32::MAX))
        })
    };
    let limits = TenantLimits {
        max_queriers: limit("max_queriers", body.max_queriers)?,
        max_outstanding: limit("max_outstanding", body.max_outstanding)?,
    };
    Ok(HttpResponse::Ok().json(broker.set_tenant(&tenant, limits).await?))
}

async fn consistency(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    let mismatches = broker.check_consistency().await?;
    Ok(HttpResponse::Ok().json(json!({
        "consistent": mismatches.is_empty(),
        "mismatches": mismatches,
    })))
}

/// Workers long-polling this broker process, per service: idle capacity.
async fn waiting_workers(broker: web::Data<Broker>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "services": broker.waiting_workers() }))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn readyz(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    broker.ping().await?;
    Ok(HttpResponse::Ok().json(json!({ "status": "ready" })))
}
