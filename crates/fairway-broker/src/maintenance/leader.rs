//! The maintenance leader: the upkeeps that work on the whole database (the reaper, the
//! promoter, the pruner, the vacuum, the resharder, the strategies' fold) run on one broker at
//! a time, the one whose connection holds a session advisory lock, as River runs its queue
//! maintainer on its elected leader. When that broker stops or dies its connection ends,
//! PostgreSQL lets the lock go, and another broker takes it at its next try.

use std::time::Duration;

use fairway_pg::Database;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::statements::{Locked, TryMaintenanceLeadership};
use super::Upkeeps;
use crate::db::sql::{FromRow, Statement};
use crate::metrics::Metrics;
use std::sync::Arc;

/// The advisory lock the leader's session holds.
const LEADER_LOCK: i64 = 0x6661_6972_6c65_6164;

/// How often a broker that is not the leader tries for the lock, and how often the leader
/// checks that its connection, and so its lock, is still there: together they bound how long
/// the upkeeps go unrun after a leader dies.
const TRY_INTERVAL: Duration = Duration::from_secs(1);

/// Longest the leader waits for its connection to answer before it counts the lock as lost: a
/// connection that hangs may already have been dropped by the server.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `upkeeps` while this broker is the leader.
pub struct MaintenanceLeader {
    database: Database,
    upkeeps: Upkeeps,
    metrics: Arc<Metrics>,
}

/// Why a term as leader, or an attempt at one, ended.
enum Ended {
    /// The broker is stopping.
    Stopped,
    /// The connection failed or hung, or could not be made (`connected` false): try again on a
    /// new one.
    Lost { error: String, connected: bool },
}

impl MaintenanceLeader {
    pub fn new(database: Database, upkeeps: Upkeeps, metrics: Arc<Metrics>) -> Self {
        Self { database, upkeeps, metrics }
    }

    /// Tries for leadership until `stop` turns true; as leader, runs the upkeeps until the lock
    /// is lost or the broker stops, then stops them, each after the pass it is in.
    pub fn spawn(self, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            // A database away for a while is said once, not at every try; a connection that
            // was made and then failed is said again.
            let mut unreachable_logged = false;
            loop {
                match self.serve_one_connection(&mut stop).await {
                    Ended::Stopped => return,
                    Ended::Lost { error, connected } => {
                        if connected || !unreachable_logged {
                            tracing::warn!(%error, "maintenance leadership connection failed; retrying");
                        }
                        unreachable_logged = !connected;
                    }
                }
                if stopped_within(&mut stop, TRY_INTERVAL).await {
                    return;
                }
            }
        })
    }

    /// On one connection: tries for the lock every [`TRY_INTERVAL`], and leads while it holds it.
    async fn serve_one_connection(&self, stop: &mut watch::Receiver<bool>) -> Ended {
        let (client, connection) = match self.database.connect().await {
            Ok(connected) => connected,
            Err(error) => {
                return Ended::Lost { error: fairway_pg::describe(&error), connected: false }
            }
        };
        let driver = tokio::spawn(connection);
        let ended = loop {
            let attempt = client
                .query_one(
                    TryMaintenanceLeadership::SQL,
                    &TryMaintenanceLeadership { lock: LEADER_LOCK }.params(),
                )
                .await
                .and_then(|row| Locked::from_row(&row));
            match attempt {
                Err(error) => {
                    break Ended::Lost { error: fairway_pg::describe(&error), connected: true }
                }
                Ok(Locked { locked: true }) => break self.lead(&client, stop).await,
                Ok(Locked { locked: false }) => {
                    if stopped_within(stop, TRY_INTERVAL).await {
                        break Ended::Stopped;
                    }
                }
            }
        };
        // Closing the connection lets the lock go at once, for the next leader.
        drop(client);
        driver.abort();
        ended
    }

    /// Runs the upkeeps while `client`'s session holds the lock.
    async fn lead(
        &self,
        client: &tokio_postgres::Client,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        tracing::info!("this broker is the maintenance leader: it runs the shared upkeeps");
        self.metrics.set_maintenance_leader(true);
        let running = self.upkeeps.start();
        let ended = loop {
            if stopped_within(stop, TRY_INTERVAL).await {
                break Ended::Stopped;
            }
            match tokio::time::timeout(CHECK_TIMEOUT, client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    let error = fairway_pg::describe(&error);
                    break Ended::Lost { error, connected: true };
                }
                Err(_) => {
                    let error = "the connection did not answer".to_owned();
                    break Ended::Lost { error, connected: true };
                }
            }
        };
        running.stop().await;
        self.metrics.set_maintenance_leader(false);
        if let Ended::Lost { error, .. } = &ended {
            tracing::warn!(%error, "lost the maintenance leadership; the shared upkeeps stopped");
        }
        ended
    }
}

/// Waits up to `wait`; true if `stop` turned true meanwhile (or its sender is gone).
async fn stopped_within(stop: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    tokio::time::timeout(wait, stop.wait_for(|stopped| *stopped)).await.is_ok()
}
