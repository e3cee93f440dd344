//! Who may call which route: one table, and the middleware that applies it to every request
//! before its handler runs. Scopes (a producer's tenants, a worker's services and own items)
//! need the request's contents, so the handlers check them, through [`Principal`].

use std::future::{ready, Ready};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::AUTHORIZATION;
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, ResponseError};

use super::error::ApiError;
use fairway_api::tokens::Role;
use fairway_broker::auth::{Authenticator, Principal, Refusal};

use Role::{Admin, Producer, Reader, Worker};

/// What the middleware needs: the tokens, and whether /metrics is protected.
pub struct AuthState {
    pub authenticator: Authenticator,
    pub metrics_require_token: bool,
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, auth on or off.
    Open,
    /// A token of one of these roles (anyone while auth is off).
    Roles(&'static [Role]),
}

const ADMIN: Access = Access::Roles(&[Admin]);
/// The admin routes' reads: what the dashboard and `fairway admin`'s listings show.
const OBSERVE: Access = Access::Roles(&[Admin, Reader]);
/// Changing jobs.
const PRODUCE: Access = Access::Roles(&[Admin, Producer]);
/// Reading jobs.
const READ_JOBS: Access = Access::Roles(&[Admin, Reader, Producer]);
/// Claiming and reporting.
const WORK: Access = Access::Roles(&[Admin, Worker]);
/// Any valid token: for what no route answers (404, 405), so that auth is asked first.
const ANY_TOKEN: Access = Access::Roles(&[Admin, Reader, Producer, Worker]);

/// Every route of the API, by method and pattern as registered. A route missing here is
/// admin-only (and tests/api/auth.rs fails until it has its row there too).
pub const ROUTES: &[(&str, &str, Access)] = &[
    ("POST", "/jobs", PRODUCE),
    ("GET", "/jobs", READ_JOBS),
    ("GET", "/jobs/{job_id}", READ_JOBS),
    ("POST", "/jobs/{job_id}/items", PRODUCE),
    ("GET", "/jobs/{job_id}/items", READ_JOBS),
    ("GET", "/jobs/{job_id}/results", READ_JOBS),
    ("POST", "/jobs/{job_id}/retry", PRODUCE),
    ("POST", "/jobs/{job_id}/{action}", PRODUCE),
    ("GET", "/work", WORK),
    ("POST", "/work/{id}/status", WORK),
    ("POST", "/queriers/{querier}/shutdown", WORK),
    ("GET", "/admin/user-work", OBSERVE),
    ("GET", "/admin/shares", OBSERVE),
    ("GET", "/admin/services", OBSERVE),
    ("GET", "/admin/version", OBSERVE),
    ("GET", "/admin/services/{service}", OBSERVE),
    ("PUT", "/admin/services/{service}", ADMIN),
    ("GET", "/admin/consistency", OBSERVE),
    ("GET", "/admin/strategies/usage", OBSERVE),
    ("GET", "/admin/waiting-workers", OBSERVE),
    ("GET", "/admin/queriers", OBSERVE),
    ("GET", "/admin/users/{user}", OBSERVE),
    ("PUT", "/admin/users/{user}", ADMIN),
    ("GET", "/admin/tenants", OBSERVE),
    ("GET", "/admin/tenants/{tenant}", OBSERVE),
    ("PUT", "/admin/tenants/{tenant}", ADMIN),
    // A producer's bulk action reaches only its tenants' jobs (the handler scopes it).
    ("POST", "/admin/jobs/{action}", PRODUCE),
    ("GET", "/admin/tokens", ADMIN),
    ("POST", "/admin/tokens", ADMIN),
    ("POST", "/admin/tokens/{id}/revoke", ADMIN),
    // Open unless --metrics-require-token: then OBSERVE.
    ("GET", "/metrics", Access::Open),
    ("GET", "/healthz", Access::Open),
    ("GET", "/readyz", Access::Open),
    // The kubelet's preStop hook sends no token; the route only makes /readyz 503 a while.
    ("GET", "/prestop", Access::Open),
];

/// Paths that hold no data, open to anyone whatever the method: the API's description and
/// the dashboard's static files (the dashboard then reads the API with a token).
const OPEN_PATTERNS: &[&str] =
    &["/", "/openapi.json", "/docs", "/docs/{_:.*}", "/ui", "/ui/", "/ui/{file}"];

/// Who may send `method` to the route registered as `pattern` (None: no route matched).
pub fn access(method: &Method, pattern: Option<&str>, metrics_require_token: bool) -> Access {
    let Some(pattern) = pattern else { return ANY_TOKEN };
    if OPEN_PATTERNS.contains(&pattern) {
        return Access::Open;
    }
    if pattern == "/metrics" && metrics_require_token {
        return OBSERVE;
    }
    let mut known = false;
    for (route_method, route_pattern, access) in ROUTES {
        if *route_pattern == pattern {
            if *route_method == method.as_str() {
                return *access;
            }
            known = true;
        }
    }
    // A method the path has no route for gets its 405 once a token was shown; a route left
    // out of the table, only an admin's.
    if known {
        ANY_TOKEN
    } else {
        ADMIN
    }
}

/// Before every handler: finds who is asking and whether their role may call the route, and
/// answers 401 or 403 itself when not. The handler finds the caller as a [`Principal`].
pub async fn authorize(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(state) = request.app_data::<web::Data<AuthState>>().cloned() else {
        // Built without auth state: a bug, and nothing is let through.
        tracing::error!("the HTTP server was built without its auth state");
        let refusal = ApiError::Unauthenticated(Refusal::Missing);
        return Ok(request.into_response(refusal.error_response()).map_into_right_body());
    };
    let pattern = request.match_pattern();
    let access = access(request.method(), pattern.as_deref(), state.metrics_require_token);
    let roles = match access {
        Access::Open => return Ok(next.call(request).await?.map_into_left_body()),
        Access::Roles(roles) => roles,
    };
    let principal = if state.authenticator.is_on() {
        match identify(&state.authenticator, &request, roles).await {
            Ok(principal) => principal,
            Err(error) => {
                return Ok(request.into_response(error.error_response()).map_into_right_body())
            }
        }
    } else {
        Principal::Anyone
    };
    request.extensions_mut().insert(principal);
    Ok(next.call(request).await?.map_into_left_body())
}

/// The token the request carries, if it is live and its role is one of `roles`.
async fn identify(
    authenticator: &Authenticator,
    request: &ServiceRequest,
    roles: &[Role],
) -> Result<Principal, ApiError> {
    let presented = bearer(request)?;
    let token = authenticator.authenticate(presented).await?.map_err(ApiError::Unauthenticated)?;
    if !roles.contains(&token.role) {
        let allowed: Vec<&str> = roles.iter().map(|role| role.as_str()).collect();
        return Err(ApiError::forbidden(
            "forbidden",
            format!(
                "a {} token may not {} {}; this needs a token of role {}",
                token.role.as_str(),
                request.method(),
                request.path(),
                allowed.join(" or ")
            ),
        ));
    }
    Ok(Principal::Token(token))
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(request: &ServiceRequest) -> Result<&str, ApiError> {
    let Some(header) = request.headers().get(AUTHORIZATION) else {
        return Err(ApiError::Unauthenticated(Refusal::Missing));
    };
    let header = header.to_str().map_err(|_| ApiError::Unauthenticated(Refusal::Malformed))?;
    let (scheme, token) =
        header.split_once(' ').ok_or(ApiError::Unauthenticated(Refusal::Malformed))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::Unauthenticated(Refusal::Malformed));
    }
    Ok(token)
}

/// A handler's caller, as the middleware found it: extracting it is how a handler asks who is
/// calling.
pub struct Caller(pub Principal);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        // Only a route the middleware let through has one; none is refused, never assumed.
        ready(
            request
                .extensions()
                .get::<Principal>()
                .cloned()
                .map(Caller)
                .ok_or(ApiError::Unauthenticated(Refusal::Missing)),
        )
    }
}

/// 403 unless `principal` may touch `tenant`'s jobs.
pub fn check_tenant(principal: &Principal, tenant: &str) -> Result<(), ApiError> {
    if principal.may_use_tenant(tenant) {
        return Ok(());
    }
    Err(ApiError::forbidden(
        "tenant_out_of_scope",
        format!(
            "this token may touch only the jobs of tenant(s) {}, not {tenant:?}",
            principal.tenants().unwrap_or_default().join(", ")
        ),
    ))
}
