//! The one LISTEN connection of a broker: it turns the database's notifications of ready work
//! and finished jobs into wake-ups of the requests this broker holds.

use std::time::Duration;

use fairway_pg::Database;
use futures_util::future;
use tokio_postgres::AsyncMessage;

use crate::db::sql::Statement;
use crate::db::ServerState;
use crate::signals::WorkSignals;

/// The channel that `counters/notify_work_ready.sql` notifies, with the service as payload.
const WORK_READY: &str = "fairway_work_ready";

/// The channel that `sql/endings/finish_jobs.sql` and `jobs/notify_job_finished.sql`
/// notify, with the job id as payload.
const JOB_FINISHED: &str = "fairway_job_finished";

/// The channel that `tenancy/notify_querier_shut_down.sql` notifies, with the querier as payload.
const QUERIER_SHUT_DOWN: &str = "fairway_querier_shut_down";

/// The longest pause between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Keeps one connection listening for work and job notifications and forwards them to `signals`,
/// reconnecting when it drops, to whichever host the configuration finds (with several hosts
/// and `target_session_attrs=read-write`, the primary after a failover). After every
/// (re)connect all waiters are woken, since notifications sent while disconnected are lost.
/// It logs once per change: connected to which host, or lost, not at every failed attempt.
pub async fn listen_for_work(database: Database, signals: WorkSignals) {
    let mut backoff = Duration::from_millis(100);
    let mut lost_logged = false;
    loop {
        let outcome = listen_once(&database, &signals).await;
        if outcome.connected {
            // A connection that was up starts the next round of attempts from the shortest
            // pause, so that a failover long after the last one is followed at once.
            backoff = Duration::from_millis(100);
            lost_logged = false;
        }
        if !lost_logged {
            match &outcome.error {
                None => tracing::warn!("work notification connection closed; reconnecting"),
                Some(error) => {
                    tracing::warn!(%error, "work notification connection failed; reconnecting")
                }
            }
            lost_logged = true;
        }
        signals.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// How one connection ended: whether it had got as far as listening, and its error if any.
struct Outcome {
    connected: bool,
    error: Option<String>,
}

async fn listen_once(database: &Database, signals: &WorkSignals) -> Outcome {
    let mut connected = false;
    // The whole chain: a standby refusing LISTEN, or a certificate the connection distrusts.
    let error = listen(database, signals, &mut connected)
        .await
        .err()
        .map(|error| fairway_pg::describe(&error));
    Outcome { connected, error }
}

async fn listen(
    database: &Database,
    signals: &WorkSignals,
    connected: &mut bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = database.connect().await?;
    let (sender, mut messages) = tokio::sync::mpsc::unbounded_channel();
    // The connection must be polled for the LISTEN below to complete, so drive it first.
    let driver = tokio::spawn(async move {
        loop {
            match future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(message)) => {
                    if sender.send(message).is_err() {
                        return Ok(());
                    }
                }
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            }
        }
    });
    client
        .batch_execute(&format!(
            "LISTEN {WORK_READY}; LISTEN {JOB_FINISHED}; LISTEN {QUERIER_SHUT_DOWN}"
        ))
        .await?;
    *connected = true;
    let state = client.query_one(ServerState::SQL, &ServerState::of_this_build().params()).await?;
    let host: String = state.try_get("host")?;
    tracing::info!(host, "work notification connection listening");
    signals.wake_all();
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(notification) = message {
            match notification.channel() {
                JOB_FINISHED => signals.job_finished(notification.payload()),
                // The querier's polls are not told apart: each one woken looks again, and
                // only the shut-down querier's get 410.
                QUERIER_SHUT_DOWN => signals.wake_polls(),
                _ => signals.work_ready(notification.payload()),
            }
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
