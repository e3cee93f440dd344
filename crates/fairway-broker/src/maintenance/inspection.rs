//! What operators read to see and check the fair order: the user_work rows, the users' shares,
//! the strategies' usage and the consistency recount; and which build a broker is beside what
//! its database holds.

use super::statements::{ListUserShares, ListUserWork, StrategyUsageOf};
use super::Maintenance;
use crate::core::snapshot;
use crate::counters;
use crate::db::{self, sql, InstalledSchema, ListFunctionSets};
use crate::error::BrokerError;
use fairway_api::build::{FunctionSetDocument, InstalledDocument, VersionDocument};
use fairway_api::model::{Mismatch, StrategyUsage, UserShare, UserWorkCursor, UserWorkRow};

impl Maintenance {
    /// This broker's build, and the schema its database holds: during an upgrade, brokers of
    /// two builds answer differently, and the database says which schema they share.
    pub async fn version(&self) -> Result<VersionDocument, BrokerError> {
        let client = self.core.client().await?;
        let installed = sql::fetch_one(&client, &InstalledSchema {}).await?;
        let sets = sql::fetch_all(&client, &ListFunctionSets {}).await?;
        Ok(VersionDocument {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            functions_revision: db::functions::REVISION,
            functions_schema: db::functions::schema().to_owned(),
            schema_migration: db::migrations::latest(),
            database: InstalledDocument {
                schema_migration: installed.schema_migration,
                function_sets: sets
                    .into_iter()
                    .map(|set| FunctionSetDocument {
                        schema: set.schema,
                        revision: set.revision,
                        version: set.version,
                        installed_at: set.installed_at,
                        last_used_at: set.last_used_at,
                        owns_triggers: set.owns_triggers,
                    })
                    .collect(),
            },
        })
    }

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
        let list = ListUserWork {
            service,
            user,
            limit,
            after_user: user_after,
            after_service: service_after,
            after_job_id: job_after,
            after_step: step_after,
            after_component: component_after,
        };
        Ok(sql::fetch_all(&client, &list).await?)
    }

    /// The `limit` users with the most running items of `service`, with their ready items:
    /// who shares the service's workers right now.
    pub async fn user_shares(
        &self,
        service: &str,
        limit: i64,
    ) -> Result<Vec<UserShare>, BrokerError> {
        let client = self.core.client().await?;
        Ok(sql::fetch_all(&client, &ListUserShares { service, limit }).await?)
    }

    /// Recounts every counter from the work items and returns each difference.
    pub async fn check_consistency(&self) -> Result<Vec<Mismatch>, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = snapshot(&mut client).await?;
        let mismatches = counters::check_consistency(&tx).await?;
        tx.commit().await?;
        Ok(mismatches)
    }

    /// For each value of metadata key `key`, the items of `service` running and ready: what a
    /// cap sees.
    pub async fn strategy_usage(
        &self,
        service: &str,
        key: &str,
    ) -> Result<Vec<StrategyUsage>, BrokerError> {
        let client = self.core.client().await?;
        Ok(sql::fetch_all(&client, &StrategyUsageOf { service, key }).await?)
    }
}
