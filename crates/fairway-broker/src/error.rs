//! The broker's one error type: what an operation can refuse or fail with, which the HTTP
//! layer maps to statuses in one place.
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

    /// The caller's token may not do this to this thing (an item another token claimed);
    /// nothing was changed.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },

    /// The tenant already has as many items waiting as its max_outstanding allows; nothing was
    /// stored.
    #[error("{0}")]
    TooManyOutstanding(String),

    /// The querier announced its shutdown: it gets no more work.
    #[error("querier {0} is shutting down; it gets no more work")]
    QuerierShuttingDown(String),

    /// PostgreSQL kept aborting the request's transaction for a deadlock or a serialization
    /// failure, every try rolled back (see `retry`); nothing was changed. Sending the request
    /// again is safe and will most likely succeed.
    #[error(
        "the database aborted this request's transaction {attempts} times ({sqlstate}: {reason}); \
         nothing was changed, send it again"
    )]
    Contended {
        operation: &'static str,
        sqlstate: &'static str,
        reason: &'static str,
        attempts: u32,
    },

    /// PostgreSQL cannot be reached (pool exhausted, connection refused or lost), or the server
    /// reached is a standby that refuses writes.
    #[error("database unavailable: {0}")]
    Unavailable(String),

    /// The batch that held the request was abandoned before answering it (a bug: its task
    /// panicked, or its statement answered for requests it was not given).
    #[error("the request's batch was lost before it was answered")]
    BatchLost,

    /// The metrics could not be encoded (a bug: a metric with labels it was not made with).
    #[error("encoding the metrics failed: {0}")]
    Metrics(String),

    /// PostgreSQL answered with an error this code did not expect.
    #[error("database error: {}", fairway_pg::describe(.0))]
    Database(#[source] tokio_postgres::Error),

    /// Installing or dropping a set of server functions failed.
    #[error(transparent)]
    Schema(#[from] crate::db::DbError),
}

impl From<fairway_api::Invalid> for BrokerError {
    fn from(invalid: fairway_api::Invalid) -> Self {
        Self::Invalid { code: invalid.code, message: invalid.message }
    }
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

/// The SQLSTATEs of a transaction PostgreSQL aborted only because of what ran beside it, and
/// which the same transaction, run again, will most likely get through.
const TRANSIENT: [(&str, &str); 2] =
    [("40P01", "deadlock detected"), ("40001", "serialization failure")];

impl BrokerError {
    /// For a deadlock or a serialization failure: its SQLSTATE and what it is.
    pub fn transient(&self) -> Option<(&'static str, &'static str)> {
        let Self::Database(error) = self else {
            return None;
        };
        let code = error.code()?.code();
        TRANSIENT.into_iter().find(|(sqlstate, _)| *sqlstate == code)
    }

    /// A copy of a `Contended` error, for each request of a batch it stopped.
    pub(super) fn copy_contended(&self) -> Option<Self> {
        match *self {
            Self::Contended { operation, sqlstate, reason, attempts } => {
                Some(Self::Contended { operation, sqlstate, reason, attempts })
            }
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for BrokerError {
    fn from(error: tokio_postgres::Error) -> Self {
        if is_unavailable(&error) {
            Self::Unavailable(fairway_pg::describe(&error))
        } else {
            Self::Database(error)
        }
    }
}

impl From<deadpool_postgres::PoolError> for BrokerError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        // Whatever stopped a connection from being made or reused, the database is not there
        // for this request.
        Self::Unavailable(crate::db::describe_pool_error(&error))
    }
}

/// A call of a server function the database lacks: this build's set is not there yet, on a
/// standby whose primary never held it, or was dropped while the broker could not mark it in
/// use. The broker installs it once it reaches a primary, or at its next mark.
fn is_missing_function(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        db.code() == &tokio_postgres::error::SqlState::UNDEFINED_FUNCTION
            && db.message().starts_with("function ")
    })
}

/// Errors that say the database cannot serve right now, rather than that a statement was wrong:
/// a closed or broken connection, a server shutting down or refusing connections.
fn is_unavailable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        // No SQLSTATE: the error came from the connection, not from a statement.
        None => {
            std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>())
        }
        Some(code) => {
            let code = code.code();
            // Class 08 connection exceptions; 57P01-57P03 shutdowns and "cannot connect now";
            // 53300 too many connections; 55000 as sent for a database closed to connections.
            // 25006: a write sent to a standby in recovery (the pool reached a standby, or
            // the server it was on became one); the request may go through on the primary.
            code.starts_with("08")
                || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "55000" | "25006")
                || is_missing_function(error)
        }
    }
}
