//! The private PostgreSQL server: what `make run`, `make test`, `fairway postgres` and the
//! tools use when no database URL is given. No part of the product depends on it.

mod args;
mod embedded;

use fairway_pg::{ConnectionStringError, Database};
use thiserror::Error;

pub use args::{DatabaseArgs, PostgresArgs};
pub use embedded::{run_command_with_postgres, EmbeddedError, EmbeddedPostgres};

#[derive(Debug, Error)]
pub enum DevDbError {
    #[error("invalid database URL: {0}")]
    InvalidUrl(#[from] ConnectionStringError),
    #[error(
        "DATABASE_URL is required: this broker starts no PostgreSQL of its own \
         (FAIRWAY_NO_EMBEDDED_POSTGRES is set, as in the container image). Set DATABASE_URL (or \
         --database-url) to the database's connection string, e.g. from the CloudNativePG \
         cluster's app Secret"
    )]
    UrlRequired,
    #[error("{0}\n(or set DATABASE_URL to use an existing PostgreSQL)")]
    PrivateServer(Box<EmbeddedError>),
}

impl From<EmbeddedError> for DevDbError {
    fn from(error: EmbeddedError) -> Self {
        Self::PrivateServer(Box::new(error))
    }
}

/// Parses a connection string, URL or key=value form, TLS settings included.
pub fn parse_config(connection_string: &str) -> Result<Database, DevDbError> {
    Ok(Database::parse(connection_string)?)
}

/// Drops the database `name` (a plain identifier), disconnecting its sessions, and creates it
/// afresh; returns `admin` with the database changed.
pub async fn recreate_database(
    admin: &Database,
    name: &str,
) -> Result<Database, tokio_postgres::Error> {
    let (client, connection) = admin.connect().await?;
    let driver = tokio::spawn(connection);
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    drop(client);
    let _ = driver.await;
    Ok(admin.with_dbname(name))
}

/// The database the settings name: `--database-url` if given, else database `dbname` on the
/// private server, started here (and returned, so that the caller stops it).
pub async fn connect_or_start(
    args: &DatabaseArgs,
    dbname: &str,
) -> Result<(Database, Option<EmbeddedPostgres>), DevDbError> {
    if let Some(url) = &args.url {
        return Ok((parse_config(url)?, None));
    }
    if args.no_embedded_postgres {
        return Err(DevDbError::UrlRequired);
    }
    let server = EmbeddedPostgres::start(args.data_dir.as_deref(), args.pg_bin.as_deref()).await?;
    server.create_database_if_missing(dbname).await?;
    let config = parse_config(&server.connection_string(dbname))?;
    tracing::info!(database = %server.connection_string(dbname), "using the private PostgreSQL server");
    Ok((config, Some(server)))
}
