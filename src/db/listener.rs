use std::time::Duration;

use futures_util::future;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::broker::WorkSignals;

/// The channel that `sql/notify_work_ready.sql` notifies, with the service as payload.
const CHANNEL: &str = "fairway_work_ready";

/// Keeps one connection listening for work notifications and forwards them to `signals`,
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
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    signals.wake_all();
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(notification) = message {
            signals.work_ready(notification.payload());
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
