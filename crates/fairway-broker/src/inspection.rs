use super::rows;
use crate::core::snapshot;
use crate::db::sql::{
    self, CHECK_CONSISTENCY, FOLD_STRATEGY_RUNNING, LIST_USER_SHARES, LIST_USER_WORK,
    STRATEGY_USAGE,
};
use crate::BrokerError;
use crate::Maintenance;
use fairway_api::model::{Mismatch, StrategyUsage, UserShare, UserWorkCursor, UserWorkRow};

impl Maintenance {
    /// Up to `limit` rows of the user_work table after `after` (from the start when None),
    /// optionally for one service and one user.
    pub async fn user_work(
        &self,
        service: Option<&str>,
        user: Option<&str>,
        limit: i64,
        after: Option<&UserWorkCursor>,
    ) -> Result<Vec<UserWorkRow>, BrokerError> {
        let client = self.core.client().await?;
        let (user_after, service_after, job_after, step_after, component_after) = match after {
            Some(key) => (
                Some(key.0.as_str()),
                Some(key.1.as_str()),
                Some(key.2 .0),
                Some(key.3),
                Some(key.4.as_str()),
            ),
            None => (None, None, None, None, None),
        };
        let params: sql::Params = &[
            &service,
            &user,
            &limit,
            &user_after,
            &service_after,
            &job_after,
            &step_after,
            &component_after,
        ];
        sql::query(&client, LIST_USER_WORK, params).await?.iter().map(rows::user_work_row).collect()
    }

    /// The `limit` users with the most running items of `service`, with their ready items:
    /// who shares the service's workers right now.
    pub async fn user_shares(
        &self,
        service: &str,
        limit: i64,
    ) -> Result<Vec<UserShare>, BrokerError> {
        let client = self.core.client().await?;
        sql::query(&client, LIST_USER_SHARES, &[&service, &limit])
            .await?
            .iter()
            .map(rows::user_share)
            .collect()
    }

    /// Recounts every counter from the work items and returns each difference.
    pub async fn check_consistency(&self) -> Result<Vec<Mismatch>, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = snapshot(&mut client).await?;
        let rows = sql::query(&tx, CHECK_CONSISTENCY, &[]).await?;
        tx.commit().await?;
        rows.iter().map(rows::mismatch).collect()
    }

    /// For each value of metadata key `key`, the items of `service` running and ready: what a
    /// cap sees.
    pub async fn strategy_usage(
        &self,
        service: &str,
        key: &str,
    ) -> Result<Vec<StrategyUsage>, BrokerError> {
        let client = self.core.client().await?;
        sql::query(&client, STRATEGY_USAGE, &[&service, &key])
            .await?
            .iter()
            .map(rows::strategy_usage)
            .collect()
    }

    /// Folds the strategies' logged running-count changes into their rows (those free now).
    pub async fn fold_strategy_running(&self) -> Result<(), BrokerError> {
        let client = self.core.client().await?;
        sql::query_one(&client, FOLD_STRATEGY_RUNNING, &[]).await?;
        Ok(())
    }
}
