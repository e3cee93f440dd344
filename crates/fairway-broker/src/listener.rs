//! The one LISTEN connection of a broker: it turns the database's notifications of ready work
//! and finished jobs into wake-ups of the requests this broker holds.

use std::time::Duration;

use futures_util::future;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::WorkSignals;

/// The channel that `sql/notify_work_ready.sql` notifies, with the service as payload.
const WORK_READY: &str = "fairway_work_ready";

/// The channel that `sql/refresh_job_status.sql` and `sql/notify_job_finished.sql` notify,
/// with the job id as payload.
const JOB_FINISHED: &str = "fairway_job_finished";

/// Keeps one connection listening for work and job notifications and forwards them to `signals`,
/// reconnecting when it drops. After every (re)connect all waiters are woken, since
/// notifications sent while disconnected are lost.
pub async fn listen_for_work(config: tokio_postgres::Config, signals: WorkSignals) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&config, &signals).await {
            Ok(()) => tracing::warn!("work notification connection closed; reconnecting"),
            Err(error) => {
                tracing::warn!(%error, "work notification connection failed; reconnecting")
            }
        }
        signals.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    signals: &WorkSignals,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
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
    client.batch_execute(&format!("LISTEN {WORK_READY}; LISTEN {JOB_FINISHED}")).await?;
    signals.wake_all();
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(notification) = message {
            if notification.channel() == JOB_FINISHED {
                signals.job_finished(notification.payload());
            } else {
                signals.work_ready(notification.payload());
            }
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
