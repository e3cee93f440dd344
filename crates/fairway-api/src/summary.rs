//! What an operator's overview shows of each service.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One service as an operator's overview shows it: the database's gauges, as fresh as
/// --metrics-refresh, and what this broker itself sees.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceSummary {
    pub service: String,
    pub ready: i64,
    /// Items waiting for their time (a retry's delay, or the job's not_before): not
    /// claimable yet.
    #[serde(default)]
    pub scheduled: i64,
    pub running: i64,
    /// Ready items of paused jobs.
    pub paused: i64,
    /// How long the oldest ready item has waited; none when nothing is ready.
    pub oldest_ready_age_seconds: Option<f64>,
    /// Users with ready or running items.
    pub active_users: i64,
    /// Claim requests this broker answered with items, per second, over the last refresh.
    pub claims_per_second: f64,
    /// Workers long-polling this broker.
    pub waiting_workers: usize,
    /// When a worker last asked any broker for this service's work; none if no worker ever
    /// did. Ready work with no ask for long means no worker serves the service.
    #[serde(default)]
    pub last_asked: Option<DateTime<Utc>>,
}
