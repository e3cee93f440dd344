//! The broker's background duties, each a type that owns its settings and its pass
//! ([`Upkeep`]), which `serve` starts: the lease reaper, the querier and shard upkeep, the
//! promoter, the pruner, the vacuum, the strategies' log fold, the sets of server functions,
//! and the asks and queue waits that the metrics read. Also what operators read to check the counters (`inspection.rs`)
//! and the metrics snapshot (`observe.rs`).

mod folder;
mod function_sets;
mod inspection;
mod leader;
mod observe;
mod promoter;
mod pruner;
mod reaper;
mod resharder;
pub mod statements;
mod vacuum;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::claims::Claims;
use crate::core::Core;
use crate::endings::Endings;
use crate::error::BrokerError;
use crate::metrics::Metrics;
pub use folder::StrategyRunningFolder;
pub use function_sets::{FunctionSetMarker, FunctionSetPruner};
pub use leader::MaintenanceLeader;
pub use observe::{AskFlusher, QueueWaitReader};
pub use promoter::Promoter;
pub use pruner::{PruneBatch, PrunedJob, Pruner};
pub use reaper::Reaper;
pub use resharder::Resharder;
pub use vacuum::Vacuum;

/// What operators and the background duties reach of the broker.
#[derive(Clone)]
pub struct Maintenance {
    pub(crate) core: Arc<Core>,
    claims: Claims,
    endings: Endings,
}

impl Maintenance {
    pub(crate) fn new(core: Arc<Core>, claims: Claims, endings: Endings) -> Self {
        Self { core, claims, endings }
    }
}

/// A background duty on a fixed cadence: one pass ([`Upkeep::run_once`], which tests call
/// directly) and how often it runs. Every pass is safe beside another broker's, so a leader
/// that lost its lock while finishing a pass does no harm.
pub trait Upkeep: Send + Sync + Sized + 'static {
    /// Its name in `fairway_upkeep_passes_total`.
    const NAME: &'static str;
    /// What the log names when a pass fails.
    const WHAT: &'static str;

    fn interval(&self) -> Duration;

    fn run_once(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;
}

/// Starts one upkeep's passes on a task of its own, given the signal that stops them.
type Starter = Box<dyn Fn(watch::Receiver<bool>) -> JoinHandle<()> + Send + Sync>;

/// Upkeeps that start together and stop together: those every broker runs for itself, or those
/// only the maintenance leader runs ([`MaintenanceLeader`]), which may start and stop them many
/// times as leadership comes and goes.
pub struct Upkeeps {
    metrics: Arc<Metrics>,
    starters: Vec<Starter>,
}

impl Upkeeps {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, starters: Vec::new() }
    }

    pub fn with<U: Upkeep>(mut self, upkeep: U) -> Self {
        let upkeep = Arc::new(upkeep);
        let passes = self.metrics.upkeep_passes(U::NAME);
        self.starters.push(Box::new(move |stop| {
            tokio::spawn(run_passes(upkeep.clone(), passes.clone(), stop))
        }));
        self
    }

    /// Starts every upkeep; [`Running::stop`] stops them.
    pub fn start(&self) -> Running {
        let (stop, stopped) = watch::channel(false);
        let tasks = self.starters.iter().map(|start| start(stopped.clone())).collect();
        Running { stop, tasks }
    }
}

/// Upkeeps started together.
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Lets each upkeep finish the pass it is in, starts no other, and waits for them all.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "an upkeep's task ended abnormally");
            }
        }
    }
}

/// Runs a pass every interval until `stop` turns true. A failed pass is logged and the next
/// one runs on time; a slow one delays the next rather than bunching them up. A pass under way
/// is never cut off: it may hold a transaction, and ends it.
async fn run_passes<U: Upkeep>(
    upkeep: Arc<U>,
    passes: IntCounter,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(upkeep.interval());
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => return,
            _ = ticker.tick() => {}
        }
        if let Err(error) = upkeep.run_once().await {
            tracing::warn!(%error, "{} failed", U::WHAT);
        }
        passes.inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A duty whose first pass fails.
    struct FailsFirst {
        passes: Arc<AtomicUsize>,
    }

    impl Upkeep for FailsFirst {
        const NAME: &'static str = "fails_first";
        const WHAT: &'static str = "a pass that fails first";

        fn interval(&self) -> Duration {
            Duration::from_secs(10)
        }

        async fn run_once(&self) -> Result<(), BrokerError> {
            match self.passes.fetch_add(1, Ordering::SeqCst) {
                0 => Err(BrokerError::Unavailable("the database is away".to_owned())),
                _ => Ok(()),
            }
        }
    }

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(Duration::from_secs(1), false).expect("metrics"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_does_not_stop_the_passes_that_follow_on_time() {
        let passes = Arc::new(AtomicUsize::new(0));
        let metrics = metrics();
        let running =
            Upkeeps::new(metrics.clone()).with(FailsFirst { passes: passes.clone() }).start();
        // The clock is paused: it jumps to each tick. Passes at 0 s, 10 s and 20 s.
        tokio::time::sleep(Duration::from_secs(25)).await;
        running.stop().await;
        assert_eq!(passes.load(Ordering::SeqCst), 3);
        assert_eq!(metrics.upkeep_passes("fails_first").get(), 3);
    }

    /// A duty whose pass takes a while.
    struct Slow {
        finished: Arc<AtomicUsize>,
    }

    impl Upkeep for Slow {
        const NAME: &'static str = "slow";
        const WHAT: &'static str = "a slow pass";

        fn interval(&self) -> Duration {
            Duration::from_secs(10)
        }

        async fn run_once(&self) -> Result<(), BrokerError> {
            tokio::time::sleep(Duration::from_secs(3)).await;
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_lets_the_pass_under_way_finish_and_starts_no_other() {
        let finished = Arc::new(AtomicUsize::new(0));
        let running = Upkeeps::new(metrics()).with(Slow { finished: finished.clone() }).start();
        tokio::time::sleep(Duration::from_secs(1)).await;
        running.stop().await;
        assert_eq!(finished.load(Ordering::SeqCst), 1, "the first pass ran to its end");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(finished.load(Ordering::SeqCst), 1, "no pass started after the stop");
    }
}
