use deadpool_postgres::Pool;

use super::DbError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Serialises migrations between brokers that start at the same time.
const MIGRATION_LOCK: i64 = 0x0066_6169_7277_6179; // "fairway"

/// Applies pending migrations from `migrations/`.
pub async fn run(pool: &Pool) -> Result<(), DbError> {
    let mut client = pool.get().await.map_err(|error| DbError::Pool(error.to_string()))?;
    let client: &mut tokio_postgres::Client = &mut client;
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let outcome = embedded::migrations::runner().run_async(client).await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
    let report = outcome.map_err(|error| DbError::Migration(error.to_string()))?;
    for migration in report.applied_migrations() {
        tracing::info!(migration = %migration, "applied migration");
    }
    Ok(())
}
