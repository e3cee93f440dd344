use super::model::{JobId, Mismatch, UserWorkRow};
use super::sql::{self, CHECK_CONSISTENCY, LIST_USER_WORK};
use super::{Broker, BrokerError};

impl Broker {
    /// Rows of the user_work table, optionally for one service and one user.
    pub async fn user_work(
        &self,
        service: Option<&str>,
        user: Option<&str>,
        limit: i64,
    ) -> Result<Vec<UserWorkRow>, BrokerError> {
        let client = self.client().await?;
        sql::query(&client, LIST_USER_WORK, &[&service, &user, &limit])
            .await?
            .iter()
            .map(|row| {
                Ok(UserWorkRow {
                    user: row.try_get("username")?,
                    tenant: row.try_get("tenant")?,
                    actor: row.try_get("actor")?,
                    job_id: JobId(row.try_get("job_id")?),
                    step: row.try_get("step_index")?,
                    service: row.try_get("service")?,
                    component: row.try_get("component")?,
                    is_async: row.try_get("is_async")?,
                    paused: row.try_get("paused")?,
                    ready_count: row.try_get("ready_count")?,
                    running_count: row.try_get("running_count")?,
                    last_worked: row.try_get("last_worked")?,
                })
            })
            .collect()
    }

    /// Recounts every counter from the work items and returns each difference.
    pub async fn check_consistency(&self) -> Result<Vec<Mismatch>, BrokerError> {
        let mut client = self.client().await?;
        // One snapshot for the whole recount, so concurrent changes cannot look like drift.
        let tx = client
            .build_transaction()
            .read_only(true)
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .start()
            .await?;
        let rows = sql::query(&tx, CHECK_CONSISTENCY, &[]).await?;
        tx.commit().await?;
        rows.iter()
            .map(|row| {
                Ok(Mismatch {
                    table: row.try_get("table_name")?,
                    key: row.try_get("row_key")?,
                    recorded: row.try_get("recorded")?,
                    actual: row.try_get("actual")?,
                })
            })
            .collect()
    }
}
