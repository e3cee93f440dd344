//! The vacuum of the fair order's tables: claims and endings leave dead row versions and index
//! entries at the head of the order, where every claim starts reading, faster than autovacuum
//! clears them under load.

use std::time::Duration;

use super::statements::VacuumFairOrder;
use super::{Maintenance, Upkeep};
use crate::db::sql::Statement;
use crate::error::BrokerError;

/// Vacuums the fair order's tables every --vacuum-interval.
pub struct Vacuum {
    maintenance: Maintenance,
    interval: Duration,
}

impl Vacuum {
    pub fn new(maintenance: &Maintenance, interval: Duration) -> Self {
        Self { maintenance: maintenance.clone(), interval }
    }
}

impl Upkeep for Vacuum {
    const NAME: &'static str = "vacuum";
    const WHAT: &'static str = "vacuum of the fair order's tables";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        let client = self.maintenance.core.client().await?;
        // Simple protocol: VACUUM cannot run in the transaction a prepared statement opens.
        client.batch_execute(VacuumFairOrder::SQL).await?;
        Ok(())
    }
}
