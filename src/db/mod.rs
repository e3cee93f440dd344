//! Everything that knows how to reach PostgreSQL: the pool, migrations, the LISTEN
//! connection and the private server used when no database URL is given.

pub mod embedded;
pub mod listener;
pub mod migrations;
pub mod pool;

use thiserror::Error;

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
}
