//! The promoter: scheduled items whose not_before has passed become ready, in batches, one
//! broker at a time (`sql/maintenance/promote_scheduled_items.sql`), as River's scheduler moves its
//! scheduled jobs to available.

use std::time::Duration;

use super::statements::PromoteScheduledItems;
use super::{Maintenance, Upkeep};
use crate::db::sql;
use crate::error::BrokerError;

/// The advisory lock a promoting transaction holds, so that brokers promote one at a time.
const PROMOTER_LOCK: i64 = 0x6661_6972_7072_6f6d;

/// Items one promoting transaction makes ready at most: each transaction holds the owners'
/// rows of its items, which claims then pass over, so it stays short.
pub const PROMOTE_BATCH: i32 = 500;

/// Batches one pass promotes at most before it yields to the next tick: a burst of due items
/// (a large job's not_before) comes out in a few passes, not one per tick per batch.
const PROMOTE_PASSES: usize = 20;

/// Makes due scheduled items ready every --promote-interval.
pub struct Promoter {
    maintenance: Maintenance,
    interval: Duration,
}

impl Promoter {
    pub fn new(maintenance: &Maintenance, interval: Duration) -> Self {
        Self { maintenance: maintenance.clone(), interval }
    }
}

impl Upkeep for Promoter {
    const NAME: &'static str = "promoter";
    const WHAT: &'static str = "promoting scheduled items";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        let promoted = self.maintenance.promote_scheduled_items().await?;
        if promoted > 0 {
            tracing::debug!(promoted, "scheduled items made ready");
        }
        Ok(())
    }
}

impl Maintenance {
    /// Makes the scheduled items whose time has come ready, [`PROMOTE_BATCH`] to a transaction,
    /// until none is left or another broker is promoting (it takes the rest). Safe to run in
    /// several brokers at once: no item is promoted twice. Returns how many it promoted.
    pub async fn promote_scheduled_items(&self) -> Result<usize, BrokerError> {
        let mut promoted = 0;
        for _ in 0..PROMOTE_PASSES {
            let batch = self
                .core
                .retrying("promote_scheduled_items", || async {
                    let client = self.core.client().await?;
                    let promote =
                        PromoteScheduledItems { lock: PROMOTER_LOCK, limit: PROMOTE_BATCH };
                    Ok(sql::fetch_one(&client, &promote).await?.promoted)
                })
                .await?;
            let Some(batch) = batch else { break };
            promoted += usize::try_from(batch).unwrap_or(0);
            if batch < PROMOTE_BATCH {
                break;
            }
        }
        Ok(promoted)
    }
}
