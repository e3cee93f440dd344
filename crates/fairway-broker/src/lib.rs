//! The broker's domain: jobs, the fair claim, status updates, leases and the counters that
//! keep the fair order, independent of how requests arrive. [`Broker`] owns one type per duty
//! (claims, endings, jobs, maintenance, policies, tenancy); each keeps its own batches and
//! statements.

pub mod auth;
pub mod batch;
mod claims;
mod core;
mod counters;
pub mod db;
mod endings;
mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod jobs;
pub mod listener;
mod maintenance;
pub mod metrics;
mod policies;
mod retry;
mod rows;
mod signals;
mod tenancy;
pub mod traces;

/// Every statement the broker runs, by duty: for the tests that plan them and the bench,
/// which runs the broker's own statements beside its baselines.
pub mod statements {
    pub use crate::auth::statements as auth;
    pub use crate::claims::statements as claims;
    pub use crate::counters::statements as counters;
    pub use crate::endings::statements as endings;
    pub use crate::jobs::statements as jobs;
    pub use crate::maintenance::statements as maintenance;
    pub use crate::policies::statements as policies;
    pub use crate::tenancy::statements as tenancy;
}

use std::collections::BTreeMap;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{watch, Notify};

pub use crate::core::BrokerSettings;
use crate::core::Core;
use crate::metrics::Metrics;
use batch::KeyedBatches;
pub use claims::Claims;
pub use endings::Endings;
pub use error::BrokerError;
pub use jobs::bulk::{BulkAction, BulkOutcome, JobFilter};
pub use jobs::{IdempotencyKey, Jobs, RetriedJob, Submission};
pub use maintenance::{
    AskFlusher, FunctionSetMarker, FunctionSetPruner, Maintenance, MaintenanceLeader, Promoter,
    PruneBatch, PrunedJob, Pruner, QueueWaitReader, Reaper, Resharder, Running,
    StrategyRunningFolder, Upkeep, Upkeeps, Vacuum,
};
pub use policies::Policies;
pub use signals::WorkSignals;
pub use tenancy::Tenancy;

/// The broker: cheap to clone, shared by every request handler and background task. It owns
/// one type per duty and what they share; handlers reach a duty through its accessor.
#[derive(Clone)]
pub struct Broker {
    core: Arc<Core>,
    duties: Arc<Duties>,
}

struct Duties {
    claims: Claims,
    endings: Endings,
    jobs: Jobs,
    maintenance: Maintenance,
    policies: Policies,
    tenancy: Tenancy,
}

impl Broker {
    pub fn new(
        pool: Pool,
        settings: BrokerSettings,
        signals: WorkSignals,
        metrics: Arc<Metrics>,
    ) -> Self {
        let core = Arc::new(Core {
            #[cfg(feature = "fault-injection")]
            faults: faults::Faults::new(pool.clone()),
            pool,
            settings,
            signals,
            metrics,
            draining: watch::Sender::new(false),
        });
        let most = settings.batch_max;
        // Each claim batch that commits releases the users rows it held, which deferred
        // endings wait for.
        let claims_committed = Arc::new(Notify::new());
        let tenancy = Tenancy::new(core.clone());
        let endings = Endings::new(
            core.clone(),
            (settings.ending_lanes, most),
            claims_committed.clone(),
            tenancy.clone(),
        );
        let claims = Claims::new(
            core.clone(),
            KeyedBatches::new(settings.claim_lanes, most),
            claims_committed,
            endings.clone(),
            tenancy.clone(),
        );
        let jobs = Jobs::new(core.clone());
        let maintenance = Maintenance::new(core.clone(), claims.clone(), endings.clone());
        let policies = Policies::new(core.clone());
        let duties = Arc::new(Duties { claims, endings, jobs, maintenance, policies, tenancy });
        Self { core, duties }
    }

    /// Handing out work: claim batches, long polls, strategies.
    pub fn claims(&self) -> &Claims {
        &self.duties.claims
    }

    /// Ending attempts: status updates, heartbeats, repeated reports.
    pub fn endings(&self) -> &Endings {
        &self.duties.endings
    }

    /// Jobs: submit, control, listings and results.
    pub fn jobs(&self) -> &Jobs {
        &self.duties.jobs
    }

    /// The background duties and what operators read: the reaper, the pruner, the vacuum, the
    /// metrics snapshot and the consistency recount.
    pub fn maintenance(&self) -> &Maintenance {
        &self.duties.maintenance
    }

    /// The policies operators set on services: caps and rate limits.
    pub fn policies(&self) -> &Policies {
        &self.duties.policies
    }

    /// Queriers, tenants and their shards.
    pub fn tenancy(&self) -> &Tenancy {
        &self.duties.tenancy
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.core.metrics
    }

    /// Test-only: the faults a test may arm in this broker's transactions.
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> &faults::Faults {
        &self.core.faults
    }

    /// How many workers of each service this broker holds in a long poll right now.
    pub fn waiting_workers(&self) -> BTreeMap<String, usize> {
        self.core.signals.waiting_workers()
    }

    /// How many producers this broker holds waiting for a job to finish right now.
    pub fn job_waiters(&self) -> usize {
        self.core.signals.job_waiters()
    }

    /// Stops handing out work, for a graceful shutdown: claims that wait answer with nothing at
    /// once, and no claim transaction starts; those running commit and answer. Reports that
    /// end attempts are still applied.
    pub fn drain(&self) {
        self.core.draining.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        self.core.is_draining()
    }

    /// Whether the database answers and takes writes: a standby in recovery answers reads
    /// but refuses every write, so a broker on one is unavailable.
    pub async fn ping(&self) -> Result<(), BrokerError> {
        let state = self.database_state().await?;
        if state.in_recovery {
            return Err(BrokerError::Unavailable(format!(
                "the database server {} is a standby in recovery and refuses writes; waiting \
                 for a writable primary",
                state.host
            )));
        }
        if !state.functions_installed {
            return Err(BrokerError::Unavailable(format!(
                "the database server {} does not hold this build's server functions yet; they \
                 are installed within a second",
                state.host
            )));
        }
        Ok(())
    }

    /// Brings the database to this build's schema and functions, as a start does: for a broker
    /// that started on a standby, whose primary may not hold this build's functions, once it
    /// reaches a primary.
    pub async fn install_schema(&self) -> Result<(), BrokerError> {
        Ok(db::migrations::run(&self.core.pool).await?)
    }

    /// Which server a pooled connection reaches, and whether it is a standby.
    pub async fn database_state(&self) -> Result<db::ServerStateRow, BrokerError> {
        let client = self.core.client().await?;
        Ok(db::sql::fetch_one(&client, &db::ServerState::of_this_build()).await?)
    }
}
