//! The API's OpenAPI 3 description, generated from the handlers' annotations so that it cannot
//! drift from them, served at `/openapi.json` and browsable at `/docs` (Swagger UI, served from
//! the binary).

use actix_web::{web, HttpResponse};
use utoipa::openapi::path::Operation;
use utoipa::openapi::{RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::SwaggerUi;

use super::auth::{access, Access};
use super::{admin, error, producers, tokens, workers};

#[derive(OpenApi)]
#[openapi(
    info(title = "fairway", description = "A fair-queueing work broker on PostgreSQL. The operators' dashboard is at [/ui/](/ui/)."),
    paths(
        producers::submit_job,
        producers::get_job,
        producers::job_results,
        producers::list_items,
        producers::list_jobs,
        producers::append_items,
        producers::steer_job,
        producers::retry_job,
        workers::get_work,
        workers::post_status,
        workers::shut_down,
        admin::user_work,
        admin::shares,
        admin::services,
        admin::service_policy,
        admin::set_service_policy,
        admin::user_policy,
        admin::set_user_policy,
        admin::consistency,
        admin::strategy_usage,
        admin::waiting_workers,
        admin::queriers,
        admin::tenants,
        admin::tenant,
        admin::set_tenant,
        admin::bulk_jobs,
        tokens::create_token,
        tokens::list_tokens,
        tokens::revoke_token,
        admin::metrics,
        admin::healthz,
        admin::readyz,
        admin::version,
        admin::prestop,
    ),
    components(schemas(error::ErrorBody, producers::JobAction, admin::BulkJobAction)),
    modifiers(&ErrorsEveryOperationMayAnswer, &BearerTokens),
    tags(
        (name = "producers", description = "Submit jobs and steer them."),
        (name = "workers", description = "Ask for work and report on it."),
        (name = "admin", description = "What operators look at and set."),
        (name = "probes", description = "Liveness, readiness and metrics."),
    ),
)]
struct ApiDoc;

/// The errors any operation may answer, added to each so that no annotation can forget them:
/// 400 for anything it reads from the request, 413 for a body too large, and 503 when the
/// database is out of reach.
struct ErrorsEveryOperationMayAnswer;

impl Modify for ErrorsEveryOperationMayAnswer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations =
                [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                add_errors(operation);
            }
        }
    }
}

fn add_errors(operation: &mut Operation) {
    let reads_request = operation.request_body.is_some()
        || operation.parameters.as_ref().is_some_and(|parameters| !parameters.is_empty());
    let mut errors = vec![("503", "The database is unavailable; try again.")];
    if reads_request {
        errors.push(("400", "The request is malformed; nothing was changed."));
    }
    if operation.request_body.is_some() {
        errors.push(("413", "The body is larger than --max-body-bytes."));
    }
    for (status, description) in errors {
        operation
            .responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| error(description));
    }
}

/// The bearer scheme, required by every operation that auth can guard (auth.rs's table), each
/// of which may then answer 401 and 403, whether or not auth is on yet. Open: the probes; and
/// /metrics unless --metrics-require-token, so its token is optional in the document.
struct BearerTokens;

impl Modify for BearerTokens {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `fairway admin tokens create` or FAIRWAY_ADMIN_TOKEN; \
                         needed once any token exists (docs/security.md).",
                    ))
                    .build(),
            ),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                (actix_web::http::Method::GET, &mut item.get),
                (actix_web::http::Method::PUT, &mut item.put),
                (actix_web::http::Method::POST, &mut item.post),
                (actix_web::http::Method::DELETE, &mut item.delete),
                (actix_web::http::Method::PATCH, &mut item.patch),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else { continue };
                if access(&method, Some(path), true) == Access::Open {
                    continue;
                }
                let bearer = SecurityRequirement::new("bearer", Vec::<String>::new());
                operation.security = Some(if access(&method, Some(path), false) == Access::Open {
                    vec![bearer, SecurityRequirement::default()]
                } else {
                    vec![bearer]
                });
                let errors = [
                    ("401", "No token, or one that is unknown, expired or revoked (with WWW-Authenticate: Bearer); nothing was changed."),
                    ("403", "The token's role or scope does not allow this; nothing was changed."),
                ];
                for (status, description) in errors {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| error(description));
                }
            }
        }
    }
}

fn error(description: &str) -> RefOr<Response> {
    let body = utoipa::openapi::ContentBuilder::new()
        .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
        .build();
    ResponseBuilder::new().description(description).content("application/json", body).build().into()
}

/// The description itself.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `/openapi.json`, and `/docs`, Swagger UI's pages reading it. The document is the same
/// whatever the auth state: auth turns on at run time (the first token), and a client that read
/// the contract before must not meet an answer it says cannot happen.
pub fn routes(config: &mut web::ServiceConfig) {
    let document = document().to_json().unwrap_or_default();
    config
        .service(web::resource("/openapi.json").route(web::get().to(move || {
            let body = document.clone();
            async move { HttpResponse::Ok().content_type("application/json").body(body) }
        })))
        .service(web::redirect("/docs", "/docs/"))
        .service(
            SwaggerUi::new("/docs/{_:.*}").config(utoipa_swagger_ui::Config::from("/openapi.json")),
        );
}
