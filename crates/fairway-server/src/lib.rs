//! fairway's HTTP server: the API, one module per audience, its OpenAPI document and the
//! dashboard, and the startup that assembles a broker behind them. Handlers validate and
//! translate; the broker decides.

mod admin;
pub mod auth;
pub mod config;
pub mod error;
pub mod openapi;
mod producers;
mod query;
pub mod startup;
pub mod telemetry;
pub mod tls;
mod tokens;
mod ui;
mod workers;

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::ConnectionType;
use actix_web::middleware::Next;
use actix_web::web;

use tracing::Instrument;
use uuid::Uuid;

use error::{json_error, path_error, ApiError};
use fairway_api::pages::PageLimit;
use fairway_broker::{traces, Broker};

/// The answer for a path no route matches: a JSON error like every other.
pub async fn no_such_route(request: actix_web::HttpRequest) -> Result<(), error::ApiError> {
    Err(error::ApiError::NoSuchRoute { path: request.path().to_owned() })
}

/// The answer for a known path asked with the wrong method.
async fn wrong_method(request: actix_web::HttpRequest) -> Result<(), error::ApiError> {
    let (method, path) = (request.method().to_string(), request.path().to_owned());
    Err(error::ApiError::WrongMethod { method, path })
}

/// An empty query parameter means the parameter was not given, so that `?service=&user=`
/// lists everything and `?cursor=` starts from the beginning.
fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|value| !value.is_empty())
}

/// Reads query parameter `name` as a number, naming it when it is not one.
fn number<T: FromStr>(name: &str, value: Option<&str>) -> Result<Option<T>, ApiError> {
    value
        .map(|text| {
            text.parse().map_err(|_| {
                ApiError::bad_request("invalid_query", format!("{name} {text:?} is not a number"))
            })
        })
        .transpose()
}

/// `?limit=`: how many entries a page holds.
fn page_limit(limit: Option<&str>) -> Result<PageLimit, ApiError> {
    match number("limit", limit)? {
        Some(limit) => Ok(PageLimit::new(limit)?),
        None => Ok(PageLimit::default()),
    }
}

/// A path of the API, answering a JSON 405 to methods it has no route for.
fn endpoint(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(wrong_method))
}

/// Registers every route and the extractors' error handling.
pub fn configure(max_body_bytes: usize) -> impl FnOnce(&mut web::ServiceConfig) {
    move |config| {
        config
            .app_data(
                web::JsonConfig::default()
                    .limit(max_body_bytes)
                    // The body is JSON by definition; don't make `curl -d` users set a header.
                    .content_type(|_| true)
                    .error_handler(json_error(max_body_bytes)),
            )
            .app_data(web::PathConfig::default().error_handler(path_error))
            .configure(producers::routes)
            .configure(workers::routes)
            .configure(admin::routes)
            .configure(tokens::routes)
            .configure(openapi::routes)
            .configure(ui::routes);
    }
}

/// The requests this server is answering: a stopping broker waits for them to end before it
/// closes its listener. And whether a preStop hook asked it to look unready.
#[derive(Default)]
pub struct Traffic {
    in_flight: AtomicUsize,
    unready_until: std::sync::Mutex<Option<Instant>>,
}

/// How long /readyz stays 503 after GET /prestop when no SIGTERM follows (a hook that failed,
/// or a caller that is no kubelet): the broker then takes traffic again.
const UNREADY_AT_MOST: Duration = Duration::from_secs(60);

impl Traffic {
    /// From now, /readyz answers 503 for `delay` and [`UNREADY_AT_MOST`] more.
    pub fn look_unready(&self, delay: Duration) {
        let until = Instant::now() + delay + UNREADY_AT_MOST;
        *self.unready_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(until);
    }

    /// Whether a preStop hook asked for /readyz to answer 503 now.
    pub fn unready(&self) -> bool {
        let until = *self.unready_until.lock().unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|until| Instant::now() < until)
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// Decrements the in-flight count however the request ends, a dropped connection included.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Around every request: gives it a request id (the caller's `X-Request-Id` when it sends a
/// usable one), returned in `X-Request-Id`; logs one line with its route pattern, status and
/// duration; counts and times it for /metrics by route pattern (`/work/{id}/status`, never the
/// path with the id in it; `unmatched` for no route). While the broker stops, every answer
/// closes its connection, so that the client's next request goes to a broker that stays.
pub async fn observe(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let route = request.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| (1..=MAX_REQUEST_ID).contains(&id.len()))
        .map(str::to_owned)
        .unwrap_or_else(|| Uuid::new_v4().to_string());
    let (method, path) = (request.method().to_string(), request.path().to_owned());
    let broker = request.app_data::<web::Data<Broker>>().cloned();
    let traffic = request.app_data::<web::Data<Traffic>>().cloned();
    let _in_flight = traffic.as_ref().map(|traffic| {
        traffic.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&traffic.in_flight)
    });
    let span = tracing::info_span!(
        target: traces::TARGET,
        "HTTP request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    // The caller's trace, when it sends one: a worker continuing a producer's trace.
    if let Some(traceparent) = request.headers().get(TRACEPARENT) {
        traces::continue_traces(&span, traceparent.to_str().ok());
    }
    let mut response = next.call(request).instrument(span.clone()).await?;
    let took = started.elapsed();
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(HeaderName::from_static(REQUEST_ID), value);
    }
    if let Some(broker) = broker {
        broker.metrics().http_request(&route, status, took);
        if broker.is_draining() {
            response.response_mut().head_mut().set_connection_type(ConnectionType::Close);
        }
    }
    // Every request is counted in fairway_http_requests_total; a line for each would bury
    // the log, so only a server error is logged by default (RUST_LOG=fairway_server=debug logs
    // them all).
    let duration_ms = took.as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::warn!(request_id, method, route, path, status, duration_ms, "request");
    } else {
        tracing::debug!(request_id, method, route, path, status, duration_ms, "request");
    }
    Ok(response)
}

/// The W3C Trace Context header: the caller's trace (docs/operating.md).
pub const TRACEPARENT: &str = "traceparent";

/// The header that carries a request's id, both ways.
const REQUEST_ID: &str = "x-request-id";

/// Longest request id taken from a caller; a longer one is replaced.
const MAX_REQUEST_ID: usize = 128;
