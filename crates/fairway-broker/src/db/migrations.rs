//! The schema: numbered migrations from `migrations/` (tables, indexes, constraints), then the
//! server functions of the workspace's `sql/`, both under one advisory lock so that brokers
//! starting together take turns.
//!
//! Migrations only add within a release (docs/schema.md), so a broker works beside migrations
//! newer than its own: during a rolling upgrade, and after a rollback, an older broker finds
//! the newer release's migrations applied, and starts.

use deadpool_postgres::Pool;
use refinery::{Migration, Runner};
use sha2::{Digest, Sha256};
use tokio_postgres::error::SqlState;

use super::{describe_pool_error, functions, DbError};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// The upgrade drill's own migration (tests/upgrade/migrations), numbered far past any
/// release's.
#[cfg(feature = "upgrade-drill")]
mod drill {
    refinery::embed_migrations!("../../tests/upgrade/migrations");
}

/// This build's migrations, in order.
fn carried() -> Vec<Migration> {
    #[allow(unused_mut)]
    let mut carried = embedded::migrations::runner().get_migrations().clone();
    #[cfg(feature = "upgrade-drill")]
    carried.extend(drill::migrations::runner().get_migrations().iter().cloned());
    carried.sort();
    carried
}

/// Serialises schema changes between brokers that start at the same time.
const MIGRATION_LOCK: i64 = 0x0066_6169_7277_6179; // "fairway"

/// How often a start tries its migrations and the move of the trigger bindings, each try
/// waiting a little for the tables' locks, before it gives up. A try also ends when it
/// deadlocks with a broker's transaction that holds one table and wants another: PostgreSQL
/// breaks the cycle by ending one of the two, and a schema change, unlike a claim, can simply
/// go again.
const BINDING_ATTEMPTS: u32 = 5;

/// How long a migration waits for a table's lock. While it waits, every claim on that table
/// queues behind it, so during a rolling upgrade a long wait would stall the older brokers.
const MIGRATION_LOCK_TIMEOUT: &str = "2s";

/// The errors after which a schema change goes again: a lock wait that timed out, a deadlock.
const BUSY: [SqlState; 2] = [SqlState::LOCK_NOT_AVAILABLE, SqlState::T_R_DEADLOCK_DETECTED];

/// Where refinery records the migrations applied. Not refinery's default name, so that a
/// database made by the unfolded migration chain, which used the default, is recognised.
const HISTORY_TABLE: &str = "fairway_schema_history";

/// Applies pending migrations, then installs the server functions if the database holds an
/// older set. Refuses a database whose schema this broker cannot vouch for, changing nothing.
///
/// A standby in recovery takes no writes, and holds whatever schema its primary has: the
/// broker then leaves the schema alone and starts anyway, unready until it reaches a primary,
/// rather than exit and be restarted over and over while a failover runs.
pub async fn run(pool: &Pool) -> Result<(), DbError> {
    let mut client =
        pool.get().await.map_err(|error| DbError::Pool(describe_pool_error(&error)))?;
    let state = super::sql::fetch_one(&client, &super::ServerState::of_this_build()).await?;
    if state.in_recovery {
        tracing::warn!(
            host = state.host,
            writable = false,
            "the database server is a standby in recovery: schema left as it is, not ready \
             until a writable primary is reached"
        );
        return Ok(());
    }
    let client: &mut tokio_postgres::Client = &mut client;
    // The pool's connections search this build's functions first, where unqualified names
    // would be created: the tables and refinery's history belong in public.
    client.batch_execute("SET search_path = public").await?;
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let mut attempt = 1;
    let outcome = loop {
        match migrate(client).await {
            Err(error) if busy(&error) && attempt < BINDING_ATTEMPTS => {
                tracing::warn!(
                    attempt,
                    %error,
                    "the tables stayed busy while the schema or the trigger bindings changed; \
                     trying again"
                );
                attempt += 1;
            }
            outcome => break outcome,
        }
    };
    client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
    client.batch_execute("RESET search_path; RESET lock_timeout").await?;
    outcome
}

/// Whether `error` ended a schema change on busy tables, so that it can go again.
fn busy(error: &DbError) -> bool {
    match error {
        DbError::Postgres(error) => error.code().is_some_and(|code| BUSY.contains(code)),
        DbError::MigrationBusy(_) => true,
        _ => false,
    }
}

/// The SQLSTATE of the first database error in `error`'s chain of sources.
fn sql_state(error: &(dyn std::error::Error + 'static)) -> Option<SqlState> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(db) = error.downcast_ref::<tokio_postgres::error::DbError>() {
            return Some(db.code().clone());
        }
        if let Some(code) = error.downcast_ref::<tokio_postgres::Error>().and_then(|e| e.code()) {
            return Some(code.clone());
        }
        next = error.source();
    }
    None
}

async fn migrate(client: &mut tokio_postgres::Client) -> Result<(), DbError> {
    refuse_unknown_schema(client).await?;
    if newer_than_carried(client).await? {
        tracing::info!(
            carried = latest(),
            "the database holds migrations newer than this broker's, which only add to the \
             schema: working beside them"
        );
    } else {
        client.batch_execute(&format!("SET lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'")).await?;
        let report = Runner::new(&carried())
            .set_migration_table_name(HISTORY_TABLE)
            .run_async(client)
            .await
            .map_err(|error| {
                let described = fairway_pg::describe(&error);
                match sql_state(&error) {
                    Some(code) if BUSY.contains(&code) => DbError::MigrationBusy(described),
                    _ => DbError::Migration(described),
                }
            })?;
        client.batch_execute("RESET lock_timeout").await?;
        for migration in report.applied_migrations() {
            tracing::info!(migration = %migration, "applied migration");
        }
    }
    let transaction = client.transaction().await?;
    functions::install(&transaction).await?;
    transaction.commit().await?;
    Ok(())
}

/// Drops the sets of server functions no broker has used for `retention`
/// ([`functions::prune`]), under the migration lock, so that no broker installs meanwhile.
/// Returns the schemas dropped.
pub async fn prune_function_sets(
    client: &mut tokio_postgres::Client,
    retention: std::time::Duration,
) -> Result<Vec<String>, DbError> {
    let transaction = client.transaction().await?;
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    let dropped = functions::prune(&transaction, retention).await?;
    transaction.commit().await?;
    Ok(dropped)
}

/// Whether the database holds a migration this broker does not carry. Every one it carries
/// must then be applied already, or the two builds' histories diverge and the broker refuses.
async fn newer_than_carried(client: &tokio_postgres::Client) -> Result<bool, DbError> {
    let exists = client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE]).await?;
    if !exists.try_get::<_, bool>(0)? {
        return Ok(false);
    }
    let applied: Vec<(i64, String)> = client
        .query(&format!("SELECT version, name FROM {HISTORY_TABLE} ORDER BY version"), &[])
        .await?
        .iter()
        .map(|row| Ok((i64::from(row.try_get::<_, i32>(0)?), row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let carried: Vec<(i64, String)> = carried()
        .iter()
        .map(|migration| (i64::from(migration.version()), migration.name().to_owned()))
        .collect();
    let named = |(version, name): &(i64, String)| format!("V{version}__{name}");
    let Some(unknown) = applied.iter().find(|migration| !carried.contains(migration)) else {
        return Ok(false);
    };
    match carried.iter().find(|migration| !applied.contains(migration)) {
        Some(missing) => {
            Err(DbError::DivergentMigrations { unknown: named(unknown), missing: named(missing) })
        }
        None => Ok(true),
    }
}

/// A database with fairway's tables but without this broker's migration history came from
/// the unfolded migration chain (or elsewhere): migrating it would start on a wrong schema.
async fn refuse_unknown_schema(client: &tokio_postgres::Client) -> Result<(), DbError> {
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL,
                    to_regclass('refinery_schema_history') IS NOT NULL,
                    to_regclass('work_items') IS NOT NULL",
            &[&HISTORY_TABLE],
        )
        .await?;
    let (has_history, has_old_history, has_items): (bool, bool, bool) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    if has_history {
        return Ok(());
    }
    if has_old_history {
        let last = client
            .query_opt(
                "SELECT format('V%s__%s', version, name)
                   FROM refinery_schema_history ORDER BY version DESC LIMIT 1",
                &[],
            )
            .await?
            .map(|row| row.try_get::<_, String>(0))
            .transpose()?
            .unwrap_or_else(|| "none".to_owned());
        return Err(DbError::UnfoldedSchema { last });
    }
    if has_items {
        return Err(DbError::ForeignSchema);
    }
    Ok(())
}

/// The last migration this build carries, as `V<n>__<name>`.
pub fn latest() -> String {
    carried().iter().max_by_key(|migration| migration.version()).map_or_else(
        || "none".to_owned(),
        |migration| format!("V{}__{}", migration.version(), migration.name()),
    )
}

/// SHA-256 over every migration and the function set: equal digests, equal schemas.
pub fn digest() -> String {
    let mut hasher = Sha256::new();
    for migration in carried() {
        hasher.update(migration.to_string().as_bytes());
        hasher.update(migration.sql().unwrap_or_default().as_bytes());
    }
    hasher.update(functions::digest().as_bytes());
    format!("{:x}", hasher.finalize())
}
