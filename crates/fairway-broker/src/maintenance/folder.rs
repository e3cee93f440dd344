//! The fold of the strategies' running-count log: claims and endings append to the log, side by
//! side without a row lock, and this pass moves it into the counts, so that the log a capped
//! claim sums stays short.

use std::time::Duration;

use super::{Maintenance, Upkeep};
use crate::counters;
use crate::error::BrokerError;

/// Folds the log every --reap-interval.
pub struct StrategyRunningFolder {
    maintenance: Maintenance,
    interval: Duration,
}

impl StrategyRunningFolder {
    pub fn new(maintenance: &Maintenance, interval: Duration) -> Self {
        Self { maintenance: maintenance.clone(), interval }
    }
}

impl Upkeep for StrategyRunningFolder {
    const NAME: &'static str = "strategy_running_fold";
    const WHAT: &'static str = "strategy running-count pass";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        let client = self.maintenance.core.client().await?;
        counters::fold_strategy_running(&client).await
    }
}
