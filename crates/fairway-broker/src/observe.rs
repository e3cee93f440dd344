//! What the broker reports about itself for /metrics: the queue gauges from the database, and
//! the queue waits of claimed items, read off the claim path.

use std::collections::BTreeMap;

use crate::db::sql::{self, ItemCreationTimes, RefreshMetrics};
use crate::metrics::PoolConnections;
use crate::{BrokerError, Maintenance};
use fairway_api::summary::ServiceSummary;

impl Maintenance {
    /// Every metric in the text exposition format. The queue gauges are at most
    /// --metrics-refresh old, and cost at most one statement per --metrics-refresh.
    pub async fn metrics_text(&self) -> Result<String, BrokerError> {
        self.refresh_gauges().await;
        let status = self.core.pool.status();
        let pool = PoolConnections {
            in_use: status.size.saturating_sub(status.available),
            idle: status.available,
            max: status.max_size,
        };
        self.core
            .metrics
            .render(&self.core.signals.waiting_workers(), pool)
            .map_err(|error| BrokerError::Metrics(error.to_string()))
    }

    /// Each service's queue as the metrics see it, for operators' overviews.
    pub async fn service_summaries(&self) -> Vec<ServiceSummary> {
        self.refresh_gauges().await;
        self.core.metrics.service_summaries(&self.core.signals.waiting_workers()).await
    }

    /// Takes the database's queue gauges again unless they are younger than --metrics-refresh.
    async fn refresh_gauges(&self) {
        let refresh_millis = sql::millis(self.core.metrics.refresh());
        self.core
            .metrics
            .refresh_gauges(|| async {
                let client = self.core.client().await?;
                let refresh = RefreshMetrics { every_millis: refresh_millis };
                Ok::<_, BrokerError>(sql::fetch_one(&client, &refresh).await?.gauges.0)
            })
            .await;
    }

    /// Reads when the first attempts claimed since the last call were created, and records how
    /// long each waited. Primary key probes, one statement for all of them.
    pub async fn record_queue_waits(&self) -> Result<(), BrokerError> {
        let claimed = self.core.metrics.take_claimed();
        if claimed.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = claimed.iter().map(|item| item.id).collect();
        let client = self.core.client().await?;
        let mut created = BTreeMap::new();
        for item in sql::fetch_all(&client, &ItemCreationTimes { ids: &ids }).await? {
            created.insert(item.id, item.created_at);
        }
        self.core.metrics.queue_waits(&claimed, &created);
        Ok(())
    }
}
