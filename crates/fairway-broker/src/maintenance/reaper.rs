//! The lease reaper: an item whose lease expired (its worker died or went silent) ends as a
//! retryable failure, so that it goes back to the queue or fails for good by its policy.

use std::time::Duration;

use super::{Maintenance, Upkeep};
use crate::error::BrokerError;

/// Expired leases examined per reaper transaction.
const REAP_BATCH: i64 = 500;

/// Most transactions one pass runs back to back, so that a large node's death drains in a few
/// passes rather than one --reap-interval per 500, and the other duties still get their turn.
const REAP_PASSES: usize = 20;

/// Expires leases every --reap-interval.
pub struct Reaper {
    maintenance: Maintenance,
    interval: Duration,
}

impl Reaper {
    pub fn new(maintenance: &Maintenance, interval: Duration) -> Self {
        Self { maintenance: maintenance.clone(), interval }
    }
}

impl Upkeep for Reaper {
    const NAME: &'static str = "reaper";
    const WHAT: &'static str = "lease reaper pass";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        for _ in 0..REAP_PASSES {
            let reaped = self.maintenance.reap_expired_leases(REAP_BATCH).await?;
            if reaped > 0 {
                tracing::info!(reaped, "expired leases returned to the queue");
            }
            if reaped < REAP_BATCH as usize {
                break;
            }
        }
        Ok(())
    }
}

impl Maintenance {
    /// Treats every expired lease (up to `limit`) as a retryable failure. Safe to run in
    /// several brokers at once: an item another reaper or its worker settled first is left
    /// alone. Returns how many leases it expired.
    pub async fn reap_expired_leases(&self, limit: i64) -> Result<usize, BrokerError> {
        self.endings.reap_expired_leases(limit).await
    }
}
