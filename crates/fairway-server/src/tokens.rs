//! Bearer tokens: made, listed and revoked by an admin (`fairway admin tokens`).

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::AuthState;
use super::endpoint;
use super::error::{ApiError, ErrorBody};
use fairway_api::tokens::{Role, TokenDocument};
use fairway_broker::auth::NewToken;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(
            endpoint("/admin/tokens")
                .route(web::get().to(list_tokens))
                .route(web::post().to(create_token)),
        )
        .service(endpoint("/admin/tokens/{id}/revoke").route(web::post().to(revoke_token)));
}

/// A token to make.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    role: Role,
    /// Default: the role and a few hex digits of the token's hash. Unique among live tokens.
    #[schema(min_length = 1, max_length = 255)]
    name: Option<String>,
    /// A producer token's tenants; absent: every tenant.
    #[schema(min_items = 1)]
    tenants: Option<Vec<String>>,
    /// A worker token's services; absent: every service.
    #[schema(min_items = 1)]
    services: Option<Vec<String>>,
    /// Seconds until it expires, at most 100 years; absent: it lasts until revoked.
    #[schema(minimum = 1, maximum = 3153600000_u64)]
    expires_in_seconds: Option<u64>,
}

/// A token just made: the secret, shown this once, and what is stored of it.
#[derive(Serialize, ToSchema)]
pub struct CreatedToken {
    /// Send it as `Authorization: Bearer <token>`. Only its hash is kept: it cannot be shown
    /// again.
    token: String,
    details: TokenDocument,
}

/// Every token.
#[derive(Serialize, ToSchema)]
pub struct Tokens {
    tokens: Vec<TokenDocument>,
}

/// Make a token (admin only). Its secret is in this answer and nowhere else.
#[utoipa::path(post, path = "/admin/tokens", tag = "admin", request_body = TokenBody,
    responses(
        (status = 201, description = "Made.", body = CreatedToken),
        (status = 409, description = "A live token already has the name.", body = ErrorBody),
))]
async fn create_token(
    state: web::Data<AuthState>,
    body: web::Json<TokenBody>,
) -> Result<HttpResponse, ApiError> {
    let TokenBody { role, name, tenants, services, expires_in_seconds } = body.into_inner();
    let new = NewToken {
        name,
        role,
        tenants,
        services,
        expires_in: expires_in_seconds.map(Duration::from_secs),
    };
    let (details, token) = state.authenticator.create(new).await?;
    tracing::info!(
        id = details.id,
        name = details.name,
        role = details.role.as_str(),
        "token made"
    );
    Ok(HttpResponse::Created().json(CreatedToken { token, details }))
}

/// Every token, revoked ones too, oldest first: names, roles, scopes, last use; never a
/// secret (admin only).
#[utoipa::path(get, path = "/admin/tokens", tag = "admin",
    responses((status = 200, description = "The tokens.", body = Tokens)))]
async fn list_tokens(state: web::Data<AuthState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Tokens { tokens: state.authenticator.list().await? }))
}

/// Revoke a token (admin only): every broker refuses it within --auth-cache-ttl. Revoking a
/// revoked token changes nothing.
#[utoipa::path(post, path = "/admin/tokens/{id}/revoke", tag = "admin",
    params(("id" = i64, Path, description = "The token's id")),
    responses(
        (status = 200, description = "The token, revoked.", body = TokenDocument),
        (status = 404, description = "No such token.", body = ErrorBody),
))]
async fn revoke_token(
    state: web::Data<AuthState>,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let token = state.authenticator.revoke(path.into_inner()).await?;
    tracing::info!(id = token.id, name = token.name, "token revoked");
    Ok(HttpResponse::Ok().json(token))
}
