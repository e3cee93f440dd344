//! What every duty of a broker shares: the pool, the settings, the signals between requests,
//! the metrics, and whether the broker is draining.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::sync::watch;

use crate::db::sql;
use crate::error::BrokerError;
use crate::metrics::Metrics;
use crate::signals::WorkSignals;

/// Behaviour that operators tune.
#[derive(Debug, Clone, Copy)]
pub struct BrokerSettings {
    /// How long a claim is leased without a heartbeat.
    pub lease: Duration,
    /// How long a claim first leases its item, when shorter than `lease` and not zero: the
    /// worker's first heartbeat or report extends it to `lease`.
    pub first_lease: Duration,
    /// Retries after a retryable failure before an item fails for good.
    pub max_retries: u32,
    /// How long a querier that neither asks for work nor holds a lease stays a member.
    pub querier_forget_delay: Duration,
    /// How many claim transactions run at once, each for a different service; claims that
    /// arrive meanwhile queue and go together in their service's next one.
    pub claim_lanes: usize,
    /// How many attempt-ending transactions run at once, each owner's endings in one of them;
    /// endings that arrive meanwhile queue and go together in their lane's next one.
    pub ending_lanes: usize,
    /// Most requests one such transaction serves.
    pub batch_max: usize,
    /// Longest a long poll is held, whatever the request asks.
    pub long_poll_max: Duration,
    /// How long a submission's Idempotency-Key is remembered.
    pub idempotency_ttl: Duration,
    /// What a submission's `retry` object leaves out.
    pub retry_defaults: fairway_api::retry::RetryPolicy,
}

pub struct Core {
    pub pool: Pool,
    pub settings: BrokerSettings,
    pub signals: WorkSignals,
    pub metrics: Arc<Metrics>,
    /// Set once the broker is stopping: it starts no claim, and waiting claims answer at once.
    pub draining: watch::Sender<bool>,
    /// Test-only: deadlocks a test arms (cargo feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub faults: crate::faults::Faults,
}

impl Core {
    pub async fn client(&self) -> Result<Object, BrokerError> {
        Ok(self.pool.get().await?)
    }

    pub fn lease_millis(&self) -> i64 {
        sql::millis(self.settings.lease)
    }

    /// The lease a claim starts with: `--first-lease` when set and shorter, else `--lease`.
    pub fn claim_lease_millis(&self) -> i64 {
        let first = self.settings.first_lease;
        if first.is_zero() || first >= self.settings.lease {
            self.lease_millis()
        } else {
            sql::millis(first)
        }
    }

    pub fn touch_every_millis(&self) -> i64 {
        // A quarter of the forget delay, at least once a second and at most every 10 ms:
        // precise enough for the admin view without a write per request on the querier's
        // shared row.
        let every = (self.settings.querier_forget_delay / 4)
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        sql::millis(every)
    }

    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Completes once the broker drains.
    pub async fn drained(&self) {
        let mut draining = self.draining.subscribe();
        // The sender lives as long as this broker, so waiting cannot fail.
        let _ = draining.wait_for(|draining| *draining).await;
    }
}

/// A read-only transaction on one snapshot, so that what several statements read agrees
/// (concurrent changes cannot look like drift, nor a finished job like a running one).
pub async fn snapshot(
    client: &mut Object,
) -> Result<deadpool_postgres::Transaction<'_>, BrokerError> {
    Ok(client
        .build_transaction()
        .read_only(true)
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?)
}
