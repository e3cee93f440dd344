//! What the broker reports about itself for /metrics: the queue gauges from the database, the
//! queue waits of claimed items, read off the claim path, and when workers last asked.

use std::collections::BTreeMap;
use std::time::Duration;

use super::statements::{ItemCreationTimes, RefreshMetrics};
use super::{Maintenance, Upkeep};
use crate::claims::asks;
use crate::db::sql;
use crate::error::BrokerError;
use crate::metrics::PoolConnections;
use fairway_api::summary::ServiceSummary;

/// How often the asks for work this broker saw are written for every broker to read.
const ASKS_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// How often the queue waits of claimed items are read.
const QUEUE_WAIT_INTERVAL: Duration = Duration::from_secs(1);

/// Writes when this broker's workers last asked for each service, every few seconds.
pub struct AskFlusher {
    maintenance: Maintenance,
}

impl AskFlusher {
    pub fn new(maintenance: &Maintenance) -> Self {
        Self { maintenance: maintenance.clone() }
    }
}

impl Upkeep for AskFlusher {
    const NAME: &'static str = "ask_flush";
    const WHAT: &'static str = "writing when workers last asked";

    fn interval(&self) -> Duration {
        ASKS_FLUSH_INTERVAL
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        self.maintenance.claims.flush_asks().await
    }
}

/// Reads, once a second, when the items claimed meanwhile were created: off the claim path,
/// so that measuring a claim's queue wait adds nothing to the claim.
pub struct QueueWaitReader {
    maintenance: Maintenance,
}

impl QueueWaitReader {
    pub fn new(maintenance: &Maintenance) -> Self {
        Self { maintenance: maintenance.clone() }
    }
}

impl Upkeep for QueueWaitReader {
    const NAME: &'static str = "queue_wait_read";
    const WHAT: &'static str = "reading claimed items' queue waits";

    fn interval(&self) -> Duration {
        QUEUE_WAIT_INTERVAL
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        self.maintenance.record_queue_waits().await
    }
}

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
        let asked_within = self.core.settings.querier_forget_delay;
        self.core
            .metrics
            .service_summaries(&waiting, &self.claims.latest_asks(), asked_within)
            .await
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
                let asked = asks::last_asked_everywhere(&client).await?;
                Ok::<_, BrokerError>((gauges, asked))
            })
            .await;
    }

    /// Reads when the first attempts claimed since the last call were created, and records how
    /// long each waited. Primary key probes, one statement for all of them.
    async fn record_queue_waits(&self) -> Result<(), BrokerError> {
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
