//! Querier and shard upkeep: queriers that shut down or went silent leave, the tenants' shards
//! are drawn again when membership changed, and tenant queues with nothing claimable retire.

use std::time::Duration;

use super::Upkeep;
use crate::error::BrokerError;
use crate::tenancy::Tenancy;

/// Recomputes membership and shards every --reap-interval.
pub struct Resharder {
    tenancy: Tenancy,
    interval: Duration,
}

impl Resharder {
    pub fn new(tenancy: &Tenancy, interval: Duration) -> Self {
        Self { tenancy: tenancy.clone(), interval }
    }
}

impl Upkeep for Resharder {
    const NAME: &'static str = "resharder";
    const WHAT: &'static str = "querier membership and tenant queue pass";

    fn interval(&self) -> Duration {
        self.interval
    }

    /// Both halves run even when the first fails: they touch different rows.
    async fn run_once(&self) -> Result<(), BrokerError> {
        let retired = self.tenancy.retire_queriers().await;
        let tidied = self.tenancy.tidy_tenant_queues().await;
        retired.and(tidied)
    }
}
