//! Everything that knows how to reach PostgreSQL: the pool, migrations, the LISTEN
//! connection and the private server used when no database URL is given.

pub mod embedded;
pub mod listener;
pub mod migrations;
pub mod pool;

use thiserror::Error;

use crate::config::DatabaseArgs;
use embedded::{EmbeddedError, EmbeddedPostgres};

#[derive(Debug, Error)]
pub enum DbError {
    #[error("invalid database URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    #[error("cannot get a database connection: {0}")]
    Pool(String),
    #[error("migration failed: {0}")]
    Migration(String),
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    #[error("{0}\n(or set DATABASE_URL to use an existing PostgreSQL)")]
    PrivateServer(Box<EmbeddedError>),
}

impl From<EmbeddedError> for DbError {
    fn from(error: EmbeddedError) -> Self {
        Self::PrivateServer(Box::new(error))
    }
}

/// The database the settings name: `--database-url` if given, else database `dbname` on the
/// private server, started here (and returned, so that the caller stops it).
pub async fn connect_or_start(
    args: &DatabaseArgs,
    dbname: &str,
) -> Result<(tokio_postgres::Config, Option<EmbeddedPostgres>), DbError> {
    if let Some(url) = &args.url {
        return Ok((pool::parse_config(url)?, None));
    }
    let server = EmbeddedPostgres::start(args.data_dir.as_deref(), args.pg_bin.as_deref()).await?;
    server.create_database_if_missing(dbname).await?;
    let config = pool::parse_config(&server.connection_string(dbname))?;
    tracing::info!(database = %server.connection_string(dbname), "using the private PostgreSQL server");
    Ok((config, Some(server)))
}
