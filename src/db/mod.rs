//! Everything that knows how to reach PostgreSQL: the pool, the schema (migrations and server
//! functions), the statements, the LISTEN connection and the private server used when no
//! database URL is given.

pub mod embedded;
pub mod functions;
pub mod listener;
pub mod migrations;
pub mod pool;
pub mod sql;

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
    #[error(
        "this database holds fairway's schema as an earlier build made it, migration by \
         migration (last applied: {last}); this broker carries the schema folded into one \
         baseline and cannot upgrade that database in place. Nothing was changed. Let its jobs \
         finish (or cancel them), then start the broker on a new, empty database: another \
         DATABASE_URL, or another --data-dir for the private server"
    )]
    UnfoldedSchema { last: String },
    #[error(
        "this database has a work_items table but no fairway migration history, so it was not \
         made by fairway; nothing was changed. Point the broker at an empty database or one \
         fairway made"
    )]
    ForeignSchema,
    #[error(
        "this database holds server functions of revision {installed}, newer than this broker's \
         revision {carried}; a broker never replaces newer functions with older ones. Nothing \
         was changed: run the newer broker, or stop every newer broker and restore an older \
         database"
    )]
    NewerFunctions { installed: i32, carried: i32 },
    #[error(
        "this database holds server functions of revision {revision} whose text differs from \
         this broker's revision {revision}; nothing was changed. A build changed \
         sql/functions/ without raising the revision (src/db/functions.rs)"
    )]
    FunctionsDiffer { revision: i32 },
    #[error("installing sql/functions/{name}.sql failed: {source}")]
    FunctionFile { name: &'static str, source: tokio_postgres::Error },
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
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

impl From<EmbeddedError> for DbError {
    fn from(error: EmbeddedError) -> Self {
        Self::PrivateServer(Box::new(error))
    }
}

/// Drops the database `name` (a plain identifier), disconnecting its sessions, and creates it
/// afresh; returns its connection config, `admin`'s with the database changed.
pub async fn recreate_database(
    admin: &tokio_postgres::Config,
    name: &str,
) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    let (client, connection) = admin.connect(tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(connection);
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    drop(client);
    let _ = driver.await;
    let mut config = admin.clone();
    config.dbname(name);
    Ok(config)
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
    if args.no_embedded_postgres {
        return Err(DbError::UrlRequired);
    }
    let server = EmbeddedPostgres::start(args.data_dir.as_deref(), args.pg_bin.as_deref()).await?;
    server.create_database_if_missing(dbname).await?;
    let config = pool::parse_config(&server.connection_string(dbname))?;
    tracing::info!(database = %server.connection_string(dbname), "using the private PostgreSQL server");
    Ok((config, Some(server)))
}
