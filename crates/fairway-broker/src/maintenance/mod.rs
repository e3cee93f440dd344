//! The broker's background duties, each a type that owns its settings and its pass
//! ([`Upkeep`]), which `serve` starts: the lease reaper, the querier and shard upkeep, the
//! promoter, the pruner, the vacuum, the strategies' log fold, and the asks and queue waits
//! that the metrics read. Also what operators read to check the counters (`inspection.rs`)
//! and the metrics snapshot (`observe.rs`).

mod folder;
mod inspection;
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

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::core::Core;
use crate::{BrokerError, Claims, Endings};
pub use folder::StrategyRunningFolder;
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
/// directly) and how often it runs. Several brokers may run each at once; every pass is safe
/// beside another broker's.
pub trait Upkeep: Send + Sync + Sized + 'static {
    /// What the log names when a pass fails.
    const WHAT: &'static str;

    fn interval(&self) -> Duration;

    fn run_once(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Runs a pass every interval on a task of its own, for ever. A failed pass is logged and
    /// the next one runs on time; a slow one delays the next rather than bunching them up.
    fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.interval());
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                if let Err(error) = self.run_once().await {
                    tracing::warn!(%error, "{} failed", Self::WHAT);
                }
            }
        })
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

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_does_not_stop_the_passes_that_follow_on_time() {
        let passes = Arc::new(AtomicUsize::new(0));
        let task = FailsFirst { passes: passes.clone() }.spawn();
        // The clock is paused: it jumps to each tick. Passes at 0 s, 10 s and 20 s.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3);
        task.abort();
    }
}
