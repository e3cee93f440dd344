//! The sets of server functions in the database (`db::functions`): every broker marks its own
//! as in use, and the maintenance leader drops the sets no broker has used for a while, once a
//! rolling upgrade or a rollback has left them behind.

use std::time::Duration;

use super::{Maintenance, Upkeep};
use crate::db::{functions, migrations};
use crate::error::BrokerError;

/// How often a broker marks its set: a quarter of the retention, so that three marks in a row
/// can fail before the set is at risk, and at most a minute apart.
pub fn marking_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

/// On every broker: marks this build's set as in use, and installs it again if it is gone,
/// which happens only when the broker could not mark it for the whole retention.
pub struct FunctionSetMarker {
    maintenance: Maintenance,
    interval: Duration,
}

impl FunctionSetMarker {
    pub fn new(maintenance: &Maintenance, retention: Duration) -> Self {
        Self { maintenance: maintenance.clone(), interval: marking_interval(retention) }
    }
}

impl Upkeep for FunctionSetMarker {
    const NAME: &'static str = "function_set_marker";
    const WHAT: &'static str = "marking this broker's server functions as in use";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        let client = self.maintenance.core.client().await?;
        let marked = functions::mark_in_use::<tokio_postgres::Client>(&client).await?;
        if !marked {
            tracing::warn!(
                schema = functions::schema(),
                "this broker's server functions were dropped while it could not mark them; \
                 installing them again"
            );
            drop(client);
            migrations::run(&self.maintenance.core.pool).await?;
        }
        Ok(())
    }
}

/// On the maintenance leader: drops the sets of server functions no broker has marked for
/// --function-set-retention.
pub struct FunctionSetPruner {
    maintenance: Maintenance,
    retention: Duration,
}

impl FunctionSetPruner {
    pub fn new(maintenance: &Maintenance, retention: Duration) -> Self {
        Self { maintenance: maintenance.clone(), retention }
    }
}

impl Upkeep for FunctionSetPruner {
    const NAME: &'static str = "function_set_pruner";
    const WHAT: &'static str = "dropping unused sets of server functions";

    fn interval(&self) -> Duration {
        marking_interval(self.retention)
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        let mut client = self.maintenance.core.client().await?;
        migrations::prune_function_sets(&mut client, self.retention).await?;
        Ok(())
    }
}
