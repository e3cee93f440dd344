//! The broker's background duties: the lease reaper, the vacuum of the fair order, and (in
//! `pruning.rs`, `observe.rs` and `inspection.rs`) the pruner, the metrics snapshot and what
//! operators read to check the counters.

use std::sync::Arc;

use crate::core::Core;
use crate::db::sql::{Statement, VacuumFairOrder};
use crate::{BrokerError, Endings};

#[derive(Clone)]
pub struct Maintenance {
    pub(crate) core: Arc<Core>,
    endings: Endings,
}

impl Maintenance {
    pub(crate) fn new(core: Arc<Core>, endings: Endings) -> Self {
        Self { core, endings }
    }

    /// Treats every expired lease (up to `limit`) as a retryable failure. Safe to run in
    /// several brokers at once: an item another reaper or its worker settled first is left
    /// alone. Returns how many leases it expired.
    pub async fn reap_expired_leases(&self, limit: i64) -> Result<usize, BrokerError> {
        self.endings.reap_expired_leases(limit).await
    }

    /// Clears the dead row versions and index entries that claims and completions leave at the
    /// head of the fair order, where every claim starts reading (see the statement's file).
    pub async fn vacuum_fair_order(&self) -> Result<(), BrokerError> {
        let client = self.core.client().await?;
        // Simple protocol: VACUUM cannot run in the transaction a prepared statement opens.
        client.batch_execute(VacuumFairOrder::SQL).await?;
        Ok(())
    }
}
