//! What the broker reports about itself for /metrics: the queue gauges from the database, and
//! the queue waits of claimed items, read off the claim path.

use std::collections::BTreeMap;

use crate::db::sql::{self, ItemCreationTimes, ListServiceAsks, RecordServiceAsks, RefreshMetrics};
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
        let waiting = self.core.signals.waiting_workers();
        self.core.metrics.service_summaries(&waiting, &self.core.asks.latest()).await
    }

    /// Takes the database's queue gauges, and when workers last asked for each service in any
    /// broker, again unless they are younger than --metrics-refresh.
    async fn refresh_gauges(&self) {
        let refresh_millis = sql::millis(self.core.metrics.refresh());
        self.core
            .metrics
            .refresh_gauges(|| async {
                let client = self.core.client().await?;
                let refresh = RefreshMetrics { every_millis: refresh_millis };
                let gauges = sql::fetch_one(&client, &refresh).await?.gauges.0;
                let asks = sql::fetch_all(&client, &ListServiceAsks {}).await?;
                let asked = asks.into_iter().map(|row| (row.service, row.last_asked)).collect();
                Ok::<_, BrokerError>((gauges, asked))
            })
            .await;
    }

    /// Writes the asks for work this broker saw since the last flush, each service's latest.
    /// One statement for all of them; a failed write is tried again at the next flush.
    pub async fn flush_asks(&self) -> Result<(), BrokerError> {
        let asks = self.core.asks.take_unwritten();
        if asks.is_empty() {
            return Ok(());
        }
        let services: Vec<&str> = asks.iter().map(|(service, _)| service.as_str()).collect();
        let asked_at: Vec<_> = asks.iter().map(|(_, at)| *at).collect();
        let record = RecordServiceAsks { services: &services, asked_at: &asked_at };
        let written = match self.core.client().await {
            Ok(client) => sql::run(&client, &record).await.map(|_| ()).map_err(BrokerError::from),
            Err(error) => Err(error),
        };
        if written.is_err() {
            self.core.asks.restore(asks);
        }
        written
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
