//! The one place where errors become HTTP responses:
//! `{"error": {"code": "<snake_case>", "message": "<human text>"}}`.

use actix_web::error::{JsonPayloadError, PathError};
use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;
use thiserror::Error;
use utoipa::ToSchema;

use fairway_broker::auth::Refusal;
use fairway_broker::BrokerError;

/// Retry-After, in seconds, of a request whose transaction kept deadlocking.
const CONTENDED_RETRY_AFTER_SECONDS: u32 = 1;

/// Retry-After, in seconds, of a request the database could not take (unreachable, or a
/// standby refusing writes).
const UNAVAILABLE_RETRY_AFTER_SECONDS: u32 = 1;

/// Every error answer's body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, snake_case: what to branch on.
    code: &'static str,
    /// For people.
    message: String,
}

impl From<fairway_api::Invalid> for ApiError {
    fn from(invalid: fairway_api::Invalid) -> Self {
        Self::Broker(invalid.into())
    }
}

#[derive(Debug, Error)]
pub enum ApiError {
    #[error(transparent)]
    Broker(#[from] BrokerError),

    /// The request could not be read as the endpoint expects.
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },

    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },

    #[error("no such endpoint: {path}")]
    NoSuchRoute { path: String },

    #[error("{path} does not take {method}")]
    WrongMethod { method: String, path: String },

    /// The broker is stopping: send the request to another one.
    #[error("this broker is shutting down")]
    ShuttingDown,

    /// No usable token: 401, with `WWW-Authenticate: Bearer`.
    #[error("{}", .0.message())]
    Unauthenticated(Refusal),

    /// The token's role or scope does not allow this: 403.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest { code, message: message.into() }
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::Forbidden { code, message: message.into() }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Broker(BrokerError::Invalid { code, .. })
            | Self::Broker(BrokerError::NotFound { code, .. })
            | Self::Broker(BrokerError::Conflict { code, .. })
            | Self::Broker(BrokerError::Forbidden { code, .. })
            | Self::Forbidden { code, .. }
            | Self::BadRequest { code, .. } => code,
            Self::Broker(BrokerError::TooManyOutstanding(_)) => "too_many_outstanding",
            Self::Broker(BrokerError::QuerierShuttingDown(_)) => "querier_shutting_down",
            Self::Broker(BrokerError::Unavailable(_)) => "database_unavailable",
            Self::Broker(BrokerError::Contended { .. }) => "database_contention",
            Self::Broker(
                BrokerError::Database(_)
                | BrokerError::Schema(_)
                | BrokerError::BatchLost
                | BrokerError::Metrics(_),
            ) => "internal_error",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::NoSuchRoute { .. } => "not_found",
            Self::WrongMethod { .. } => "method_not_allowed",
            Self::ShuttingDown => "shutting_down",
            Self::Unauthenticated(Refusal::Missing) => "missing_token",
            Self::Unauthenticated(Refusal::Malformed | Refusal::Unknown) => "invalid_token",
            Self::Unauthenticated(Refusal::Expired) => "token_expired",
            Self::Unauthenticated(Refusal::Revoked) => "token_revoked",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Broker(BrokerError::Invalid { .. }) | Self::BadRequest { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::Broker(BrokerError::NotFound { .. }) => StatusCode::NOT_FOUND,
            Self::Broker(BrokerError::Conflict { .. }) => StatusCode::CONFLICT,
            Self::Broker(BrokerError::TooManyOutstanding(_)) => StatusCode::TOO_MANY_REQUESTS,
            Self::Broker(BrokerError::QuerierShuttingDown(_)) => StatusCode::GONE,
            Self::Broker(BrokerError::Unavailable(_) | BrokerError::Contended { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Broker(
                BrokerError::Database(_)
                | BrokerError::Schema(_)
                | BrokerError::BatchLost
                | BrokerError::Metrics(_),
            ) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NoSuchRoute { .. } => StatusCode::NOT_FOUND,
            Self::WrongMethod { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Broker(BrokerError::Forbidden { .. }) | Self::Forbidden { .. } => {
                StatusCode::FORBIDDEN
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        // Unexpected database errors are logged in full and reported without internals.
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = ?self, "request failed");
            "internal error; see the broker's log".to_owned()
        } else {
            self.to_string()
        };
        let mut response = HttpResponse::build(status);
        if let Self::Unauthenticated(refusal) = self {
            // RFC 6750: a presented token that failed is an invalid_token; none, no error.
            let challenge = match refusal {
                Refusal::Missing => r#"Bearer realm="fairway""#,
                _ => r#"Bearer realm="fairway", error="invalid_token""#,
            };
            response.insert_header((actix_web::http::header::WWW_AUTHENTICATE, challenge));
        }
        // Contention passes: the same request, sent again shortly, most likely goes through.
        if let Self::Broker(BrokerError::Contended { .. }) = self {
            response.insert_header((header::RETRY_AFTER, CONTENDED_RETRY_AFTER_SECONDS));
        }
        // A database away (a restart, a failover to the standby) is back within seconds, and
        // a stopping broker's clients reach another one on their next connection.
        if let Self::Broker(BrokerError::Unavailable(_)) | Self::ShuttingDown = self {
            response.insert_header((header::RETRY_AFTER, UNAVAILABLE_RETRY_AFTER_SECONDS));
        }
        response.json(ErrorBody { error: ErrorDetail { code: self.code(), message } })
    }
}

/// Turns an unreadable JSON body into a JSON error: 413 when too large, else 400.
pub fn json_error(limit: usize) -> impl Fn(JsonPayloadError, &HttpRequest) -> actix_web::Error {
    move |error, request| {
        let api_error = match error {
            JsonPayloadError::Overflow { .. } | JsonPayloadError::OverflowKnownLength { .. } => {
                ApiError::PayloadTooLarge { limit }
            }
            // actix refuses a body without a Content-Type before reading it; a request with no
            // body at all (`curl -X POST` without `-d`) is the usual case.
            JsonPayloadError::ContentType if !has_body(request) => empty_body(),
            JsonPayloadError::ContentType => ApiError::bad_request(
                "invalid_body",
                "invalid request body: it came without a Content-Type header; send it as \
                 application/json",
            ),
            JsonPayloadError::Deserialize(error) if error.is_eof() && error.column() == 0 => {
                empty_body()
            }
            JsonPayloadError::Deserialize(error) => invalid_body(&error),
            other => {
                ApiError::bad_request("invalid_body", format!("invalid request body: {other}"))
            }
        };
        api_error.into()
    }
}

/// A body that is JSON but not what the route takes.
pub fn invalid_body(error: &serde_json::Error) -> ApiError {
    let message = without_type_names(&error.to_string());
    ApiError::bad_request("invalid_body", format!("invalid request body: {message}"))
}

/// serde's message with the Rust type it expected said as the JSON it wants: a client knows
/// no `StepBody`.
fn without_type_names(message: &str) -> String {
    let mut plain = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected struct ") {
        plain.push_str(&rest[..at]);
        plain.push_str("expected a JSON object");
        rest = &rest[at + "expected struct ".len()..];
        rest = rest.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
    }
    plain.push_str(rest);
    plain
}

fn has_body(request: &HttpRequest) -> bool {
    let length = request.headers().get(header::CONTENT_LENGTH);
    let chunked = request.headers().contains_key(header::TRANSFER_ENCODING);
    chunked || length.is_some_and(|length| length.as_bytes() != b"0")
}

fn empty_body() -> ApiError {
    ApiError::bad_request(
        "invalid_body",
        "the request has no body: this route takes a JSON object (docs/api.md)",
    )
}

pub fn path_error(error: PathError, _: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request("invalid_path", format!("invalid path: {error}")).into()
}

#[cfg(test)]
mod tests {
    use super::without_type_names;

    #[test]
    fn a_body_error_names_json_not_rust_types() {
        assert_eq!(
            without_type_names(r#"invalid type: string "x", expected struct StepBody at line 1"#),
            r#"invalid type: string "x", expected a JSON object at line 1"#
        );
        assert_eq!(without_type_names("missing field `user`"), "missing field `user`");
    }
}
