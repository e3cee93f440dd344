//! The schema: numbered migrations from `migrations/` (tables, indexes, constraints), then the
//! server functions of the workspace's `sql/`, both under one advisory lock so that brokers
//! starting together take turns.

use deadpool_postgres::Pool;
use sha2::{Digest, Sha256};

use super::{describe_pool_error, functions, DbError};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// Serialises schema changes between brokers that start at the same time.
const MIGRATION_LOCK: i64 = 0x0066_6169_7277_6179; // "fairway"

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
    let state = super::sql::fetch_one(&client, &super::ServerState {}).await?;
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
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let outcome = migrate(client).await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
    outcome
}

async fn migrate(client: &mut tokio_postgres::Client) -> Result<(), DbError> {
    refuse_unknown_schema(client).await?;
    let report = embedded::migrations::runner()
        .set_migration_table_name(HISTORY_TABLE)
        .run_async(client)
        .await
        .map_err(|error| DbError::Migration(fairway_pg::describe(&error)))?;
    for migration in report.applied_migrations() {
        tracing::info!(migration = %migration, "applied migration");
    }
    let transaction = client.transaction().await?;
    functions::install(&transaction).await?;
    transaction.commit().await?;
    Ok(())
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
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .max_by_key(|migration| migration.version())
        .map_or_else(
            || "none".to_owned(),
            |migration| format!("V{}__{}", migration.version(), migration.name()),
        )
}

/// SHA-256 over every migration and the function set: equal digests, equal schemas.
pub fn digest() -> String {
    let mut hasher = Sha256::new();
    for migration in embedded::migrations::runner().get_migrations() {
        hasher.update(migration.to_string().as_bytes());
        hasher.update(migration.sql().unwrap_or_default().as_bytes());
    }
    hasher.update(functions::digest().as_bytes());
    format!("{:x}", hasher.finalize())
}
