use thiserror::Error;

/// Everything a broker operation can refuse or fail with. The HTTP layer maps each variant to
/// a status code in one place (`http::error`).
#[derive(Debug, Error)]
pub enum BrokerError {
    /// The request is malformed or names impossible values; nothing was changed.
    #[error("{message}")]
    Invalid { code: &'static str, message: String },

    /// The thing the request names does not exist.
    #[error("{message}")]
    NotFound { code: &'static str, message: String },

    /// The request is well formed but conflicts with the current state (a stale attempt, a
    /// finished item or job); nothing was changed.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },

    /// PostgreSQL cannot be reached (pool exhausted, connection refused or lost).
    #[error("database unavailable: {0}")]
    Unavailable(String),

    /// PostgreSQL answered with an error this code did not expect.
    #[error("database error: {}", describe(.0))]
    Database(#[source] tokio_postgres::Error),
}

impl BrokerError {
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid { code, message: message.into() }
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::NotFound { code, message: message.into() }
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Conflict { code, message: message.into() }
    }
}

impl From<tokio_postgres::Error> for BrokerError {
    fn from(error: tokio_postgres::Error) -> Self {
        // Errors without a SQLSTATE come from the connection, not from a statement.
        if error.is_closed() || error.code().is_none() {
            Self::Unavailable(error.to_string())
        } else {
            Self::Database(error)
        }
    }
}

impl From<deadpool_postgres::PoolError> for BrokerError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(error) => error.into(),
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// The server's own words for a statement error (tokio-postgres's Display says only "db error").
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => error.to_string(),
    }
}
