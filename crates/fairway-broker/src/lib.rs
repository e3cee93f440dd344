//! The broker's domain: jobs, the fair claim, status updates, leases and the counters that
//! keep the fair order, independent of how requests arrive.

mod admin;
pub mod auth;
pub mod batch;
mod claim;
pub mod db;
mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod jobs;
pub mod listing;
pub mod membership;
pub mod metrics;
mod observe;
mod outcome;
pub mod pruning;
mod retry;
mod rows;
mod signals;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{watch, Notify};

use crate::db::sql;
use crate::metrics::Metrics;
use batch::Batches;
use claim::Look;
pub use error::BrokerError;
use fairway_api::model::ClaimRequest;
use outcome::{Answer, AttemptEnding};
pub use signals::WorkSignals;

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
    /// How many claim transactions, and how many attempt-ending transactions, run at once;
    /// requests that arrive meanwhile queue and go together in the next one.
    pub batch_lanes: usize,
    /// Most requests one such transaction serves.
    pub batch_max: usize,
    /// Longest a long poll is held, whatever the request asks.
    pub long_poll_max: Duration,
}

/// The broker: cheap to clone, shared by every request handler and background task.
#[derive(Clone)]
pub struct Broker {
    pool: Pool,
    settings: BrokerSettings,
    signals: WorkSignals,
    claims: Batches<ClaimRequest, Result<Look, BrokerError>>,
    endings: Batches<AttemptEnding, Result<Answer, BrokerError>>,
    /// Each claim batch of this broker that committed: it released the users rows it held,
    /// which deferred endings wait for.
    claims_committed: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// Set once the broker is stopping: it starts no claim, and waiting claims answer at once.
    draining: Arc<watch::Sender<bool>>,
    /// Test-only: deadlocks a test arms (cargo feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    faults: Arc<faults::Faults>,
}

impl Broker {
    pub fn new(
        pool: Pool,
        settings: BrokerSettings,
        signals: WorkSignals,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (lanes, most) = (settings.batch_lanes, settings.batch_max);
        let (claims, endings) = (Batches::new(lanes, most), Batches::new(lanes, most));
        let claims_committed = Arc::new(Notify::new());
        let draining = Arc::new(watch::Sender::new(false));
        Self {
            #[cfg(feature = "fault-injection")]
            faults: Arc::new(faults::Faults::new(pool.clone())),
            pool,
            settings,
            signals,
            claims,
            endings,
            claims_committed,
            metrics,
            draining,
        }
    }

    /// Test-only: the faults a test may arm in this broker's transactions.
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> &faults::Faults {
        &self.faults
    }

    async fn client(&self) -> Result<Object, BrokerError> {
        Ok(self.pool.get().await?)
    }

    fn lease_millis(&self) -> i64 {
        sql::millis(self.settings.lease)
    }

    /// The lease a claim starts with: `--first-lease` when set and shorter, else `--lease`.
    fn claim_lease_millis(&self) -> i64 {
        let first = self.settings.first_lease;
        if first.is_zero() || first >= self.settings.lease {
            self.lease_millis()
        } else {
            sql::millis(first)
        }
    }

    /// Queues `request` in `batches` and waits for its answer; whichever lane is free serves
    /// the batch with `run`, given this broker, and hands the answers whose callers left
    /// meanwhile to `unanswered`.
    async fn in_batch<R, T, Fut, UFut>(
        &self,
        batches: &Batches<R, Result<T, BrokerError>>,
        request: R,
        run: fn(Broker, Vec<R>) -> Fut,
        unanswered: fn(Broker, Vec<Result<T, BrokerError>>) -> UFut,
    ) -> Result<T, BrokerError>
    where
        R: Send + 'static,
        T: Send + 'static,
        Fut: Future<Output = Vec<Result<T, BrokerError>>> + Send + 'static,
        UFut: Future<Output = ()> + Send + 'static,
    {
        let broker = self.clone();
        let run = move |batch: Vec<R>| run(broker.clone(), batch);
        let broker = self.clone();
        let unanswered = move |answers| unanswered(broker.clone(), answers);
        batches.submit(request, run, unanswered).await.unwrap_or(Err(BrokerError::BatchLost))
    }

    /// How many workers of each service this broker holds in a long poll right now.
    pub fn waiting_workers(&self) -> std::collections::BTreeMap<String, usize> {
        self.signals.waiting_workers()
    }

    /// How many producers this broker holds waiting for a job to finish right now.
    pub fn job_waiters(&self) -> usize {
        self.signals.job_waiters()
    }

    /// Stops handing out work, for a graceful shutdown: claims that wait answer with nothing at
    /// once, and no claim transaction starts; those running commit and answer. Reports that
    /// end attempts are still applied.
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Completes once the broker drains.
    async fn drained(&self) {
        let mut draining = self.draining.subscribe();
        // The sender lives as long as this broker, so waiting cannot fail.
        let _ = draining.wait_for(|draining| *draining).await;
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), BrokerError> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }
}

/// A read-only transaction on one snapshot, so that what several statements read agrees
/// (concurrent changes cannot look like drift, nor a finished job like a running one).
async fn snapshot(client: &mut Object) -> Result<deadpool_postgres::Transaction<'_>, BrokerError> {
    Ok(client
        .build_transaction()
        .read_only(true)
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?)
}
