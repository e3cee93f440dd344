//! Everything that knows how to reach PostgreSQL: the pool, the schema (migrations and server
//! functions), how statements run, and which server the pool reaches.

pub mod functions;
pub mod migrations;
pub mod pool;
pub mod sql;

use deadpool_postgres::PoolError;
use thiserror::Error;

use sql::{row, statement};

statement! {
    /// Whether the server is a standby, which it is, and whether it holds this build's server
    /// functions (`functions::schema`).
    ServerState<'a> = "server_state" -> ServerStateRow { schema: &'a str }
}

impl ServerState<'static> {
    /// The state of the server, as this build sees it.
    pub fn of_this_build() -> Self {
        Self { schema: functions::schema() }
    }
}

row! {
    ServerStateRow {
        in_recovery: bool,
        host: String,
        functions_installed: bool,
    }
}

statement! {
    /// The last migration the database holds.
    InstalledSchema = "installed_schema" -> InstalledSchemaRow {}
}

row! {
    InstalledSchemaRow {
        schema_migration: Option<String>,
    }
}

statement! {
    /// Every set of server functions the database holds.
    ListFunctionSets = "list_function_sets" -> FunctionSetRow {}
}

row! {
    FunctionSetRow {
        schema: String,
        revision: i32,
        version: String,
        installed_at: chrono::DateTime<chrono::Utc>,
        last_used_at: chrono::DateTime<chrono::Utc>,
        owns_triggers: bool,
    }
}

/// This build, in words: the release, and the schema it carries.
pub fn build_description() -> String {
    format!(
        "{} (server functions revision {}, schema {})",
        env!("CARGO_PKG_VERSION"),
        functions::REVISION,
        migrations::latest()
    )
}

/// Why the pool handed out no connection: for one it could not make, the driver's error alone,
/// since the pool's wrapper adds only "Error occurred while creating a new object".
pub fn describe_pool_error(error: &PoolError) -> String {
    match error {
        PoolError::Backend(error) => fairway_pg::describe(error),
        other => fairway_pg::describe(other),
    }
}

#[derive(Debug, Error)]
pub enum DbError {
    #[error("cannot get a database connection: {0}")]
    Pool(String),
    #[error("migration failed: {0}")]
    Migration(String),
    /// A migration met tables other brokers were using: its wait for a lock timed out, or it
    /// deadlocked with a broker's transaction and PostgreSQL ended it. It changed nothing and
    /// can go again.
    #[error("migration failed on busy tables: {0}")]
    MigrationBusy(String),
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
        "the database records the set of server functions in schema {schema} with text other \
         than this broker's; nothing was changed. A build changed a function's file without \
         raising the revision (crates/fairway-broker/src/db/functions.rs), or the row was edited"
    )]
    FunctionsDiffer { schema: String },
    #[error(
        "this database holds migration {unknown}, which this broker does not carry, but lacks \
         this broker's migration {missing}: the two come from diverging builds. Nothing was \
         changed"
    )]
    DivergentMigrations { unknown: String, missing: String },
    #[error("installing {path} failed: {}", fairway_pg::describe(source))]
    FunctionFile { path: String, source: tokio_postgres::Error },
    #[error("{}", fairway_pg::describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
}
