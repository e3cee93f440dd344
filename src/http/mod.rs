//! The HTTP API, one module per audience. Handlers validate and translate; the broker decides.

mod admin;
pub mod error;
pub mod openapi;
mod producers;
mod workers;

use std::str::FromStr;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;

use crate::broker::listing::PageLimit;
use crate::broker::Broker;
use error::{json_error, path_error, query_error, ApiError};

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
            .app_data(web::QueryConfig::default().error_handler(query_error))
            .app_data(web::PathConfig::default().error_handler(path_error))
            .configure(producers::routes)
            .configure(workers::routes)
            .configure(admin::routes)
            .configure(openapi::routes);
    }
}

/// Counts and times every request by its route pattern (`/work/{id}/status`, never the path
/// with the id in it), and by status code; a path no route matches counts as `unmatched`.
pub async fn observe(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let route = request.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let broker = request.app_data::<web::Data<Broker>>().cloned();
    let response = next.call(request).await?;
    if let Some(broker) = broker {
        broker.metrics().http_request(&route, response.status().as_u16(), started.elapsed());
    }
    Ok(response)
}
