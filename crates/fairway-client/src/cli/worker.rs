//! `fairway worker`: long-polls for items of one service and runs a command per item, so that
//! any executable becomes a fairway service. On SIGTERM or SIGINT it takes no more work,
//! finishes what it holds, reports it, and exits.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::{client, CliError};
use crate::args::WorkerArgs;
use crate::{ClaimParams, Client, ClientError, Report};
use fairway_api::model::WorkItem;

/// How much of a failed command's standard error goes into the item's error.
const ERROR_TAIL_BYTES: usize = 2048;

/// Pause after the broker could not be reached, before asking again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Tries of a report the broker did not answer, before the item is left to its lease.
const REPORT_TRIES: u32 = 5;

pub async fn run(args: WorkerArgs) -> Result<(), CliError> {
    if args.wait > Duration::from_secs(60) {
        return Err(CliError::Input("--wait must be at most 60s".to_owned()));
    }
    let client = client(&args.broker)?;
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    let slots: Vec<_> = (0..args.concurrency)
        .map(|slot| tokio::spawn(work_slot(client.clone(), args.clone(), slot, stop.clone())))
        .collect();
    for slot in slots {
        // A slot's panic is a bug; the others still finish what they hold.
        if let Err(error) = slot.await {
            tracing::error!(%error, "a worker slot stopped unexpectedly");
        }
    }
    tracing::info!("stopped: every item taken was reported");
    Ok(())
}

async fn stop_on_signal(stop: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping: no more work is taken; finishing the items held");
    stop.cancel();
}

/// One slot: claims an item, works it, reports it, until told to stop. A long poll under way
/// when the stop comes is abandoned; an item the broker leased for it meanwhile goes back to
/// the queue when that lease expires.
async fn work_slot(client: Client, args: WorkerArgs, slot: u32, stop: CancellationToken) {
    let params = ClaimParams {
        service: &args.service,
        querier: &args.querier,
        worker: slot % 1024,
        max: 1,
        wait: args.wait,
    };
    while !stop.is_cancelled() {
        let claimed = tokio::select! {
            _ = stop.cancelled() => break,
            claimed = client.claim(&params) => claimed,
        };
        match claimed {
            Ok(items) => {
                for item in items {
                    work(&client, &args, item).await;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "asking for work failed");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(RETRY_PAUSE) => {}
                }
            }
        }
    }
}

/// Runs the command on one item, heartbeating while it runs, and reports how it ended.
async fn work(client: &Client, args: &WorkerArgs, item: WorkItem) {
    let (id, attempt) = (item.id.0, item.attempt);
    let report = tokio::select! {
        report = run_command(&args.command, &item) => report,
        lost = heartbeat(client, id, attempt, first_heartbeat(&item, args.heartbeat), args.heartbeat) => {
            // The command is killed when its future is dropped here.
            tracing::warn!(item = id, attempt, reason = %lost, "gave up the item");
            return;
        }
    };
    for try_number in 1..=REPORT_TRIES {
        match client.report(id, &report).await {
            Ok(answer) => {
                tracing::info!(item = id, attempt, status = ?answer.status, "reported");
                return;
            }
            Err(error) if error.is_transient() && try_number < REPORT_TRIES => {
                tracing::warn!(item = id, %error, "report failed; trying again");
                tokio::time::sleep(RETRY_PAUSE * try_number).await;
            }
            Err(error) => {
                tracing::error!(item = id, %error, "report refused; the lease will return the item");
                return;
            }
        }
    }
}

/// When the first heartbeat goes: after `every`, or once half of the lease the claim gave has
/// passed if that is sooner (a broker with --first-lease hands out short first leases, which
/// the first heartbeat extends).
fn first_heartbeat(item: &WorkItem, every: Duration) -> Duration {
    let left = (item.lease_expires_at - chrono::Utc::now()).to_std().unwrap_or_default();
    every.min(left / 2)
}

/// Extends the lease after `first`, then every `every`, until the broker says the attempt is no
/// longer this worker's (a cancel, or a lease that expired); returns why.
async fn heartbeat(
    client: &Client,
    id: i64,
    attempt: i32,
    first: Duration,
    every: Duration,
) -> ClientError {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    loop {
        ticker.tick().await;
        match client.report(id, &Report::Running { attempt }).await {
            Ok(_) => {}
            Err(error) if error.is_transient() => {
                tracing::warn!(item = id, %error, "heartbeat failed; trying again next time");
            }
            Err(error) => return error,
        }
    }
}

/// The command's verdict on the item, as the report to send.
async fn run_command(command: &[String], item: &WorkItem) -> Report {
    let attempt = item.attempt;
    let failed =
        |error: String, retryable: bool| Report::Failed { attempt, error: Some(error), retryable };
    let Some((program, arguments)) = command.split_first() else {
        return failed("no command to run".to_owned(), false);
    };
    let input = match serde_json::to_vec(item) {
        Ok(input) => input,
        Err(error) => return failed(format!("cannot encode the item: {error}"), false),
    };
    let child = Command::new(program)
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return failed(format!("cannot start {program}: {error}"), true),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input closes the pipe early; that is its business.
        let _ = stdin.write_all(&input).await;
    }
    let output = match child.wait_with_output().await {
        Ok(output) => output,
        Err(error) => return failed(format!("waiting for {program}: {error}"), true),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let start = stderr.len().saturating_sub(ERROR_TAIL_BYTES);
        let start = (start..stderr.len()).find(|&at| stderr.is_char_boundary(at)).unwrap_or(0);
        return failed(format!("{}: {}", output.status, stderr[start..].trim()), true);
    }
    match serde_json::from_slice::<Value>(&output.stdout) {
        Ok(Value::Array(results)) => Report::Successful { attempt, results, component: None },
        _ => failed("the command exited 0 but its output is not a JSON array".to_owned(), false),
    }
}
