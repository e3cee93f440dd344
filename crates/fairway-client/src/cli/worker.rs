//! `fairway worker`: long-polls for items of one service and runs a command per item, so that
//! any executable becomes a fairway service. On SIGTERM or SIGINT it takes no more work,
//! finishes what it holds, reports it, and exits.
//!
//! A broken command must not fail the whole backlog: a command that cannot be started at all
//! stops the worker (exit non-zero), and a command that fails on several items in a row makes
//! it pause before taking more, doubling the pause while the failures go on. It also exits when
//! the broker says its querier was shut down (410).

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
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

/// Failures in a row, over every slot, after which the worker pauses before taking more work:
/// one item failing is the item's problem, several in a row are likely the command's.
const FAILURES_BEFORE_PAUSE: u32 = 3;

/// The first pause after [`FAILURES_BEFORE_PAUSE`] failures in a row; each further failure
/// doubles it, up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_secs(2);
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// How much of the output of a command that printed no JSON array its error quotes.
const OUTPUT_QUOTE_BYTES: usize = 200;

/// What every slot shares: the stop, why the worker stopped on its own (if it did), and the
/// command's failures in a row.
struct Shared {
    stop: CancellationToken,
    fatal: OnceLock<String>,
    failures_in_a_row: AtomicU32,
    /// Whether the worker said that no job has named its service.
    warned_unknown_service: AtomicBool,
}

impl Shared {
    /// Stops every slot, and makes the worker exit with `reason` once they finished.
    fn halt(&self, reason: String) {
        if self.fatal.set(reason.clone()).is_ok() {
            tracing::error!("stopping: {reason}");
        }
        self.stop.cancel();
    }

    /// How long to wait before taking work, after the command's failures in a row.
    fn pause(&self) -> Option<Duration> {
        let failures = self.failures_in_a_row.load(Ordering::Relaxed);
        let beyond = failures.checked_sub(FAILURES_BEFORE_PAUSE)?;
        Some(FIRST_PAUSE.saturating_mul(1 << beyond.min(5)).min(LONGEST_PAUSE))
    }
}

pub async fn run(args: WorkerArgs) -> Result<(), CliError> {
    if args.wait > Duration::from_secs(60) {
        return Err(CliError::Input("--wait must be at most 60s".to_owned()));
    }
    let client = client(&args.broker)?;
    let shared = Arc::new(Shared {
        stop: CancellationToken::new(),
        fatal: OnceLock::new(),
        failures_in_a_row: AtomicU32::new(0),
        warned_unknown_service: AtomicBool::new(false),
    });
    tokio::spawn(stop_on_signal(shared.stop.clone()));
    let slots: Vec<_> = (0..args.concurrency)
        .map(|slot| tokio::spawn(work_slot(client.clone(), args.clone(), slot, shared.clone())))
        .collect();
    for slot in slots {
        // A slot's panic is a bug; the others still finish what they hold.
        if let Err(error) = slot.await {
            tracing::error!(%error, "a worker slot stopped unexpectedly");
        }
    }
    tracing::info!("stopped: every item taken was reported");
    match shared.fatal.get() {
        Some(reason) => Err(CliError::Found(reason.clone())),
        None => Ok(()),
    }
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
async fn work_slot(client: Client, args: WorkerArgs, slot: u32, shared: Arc<Shared>) {
    let stop = &shared.stop;
    let params = ClaimParams {
        service: &args.service,
        querier: &args.querier,
        worker: slot % 1024,
        max: 1,
        wait: args.wait,
    };
    while !stop.is_cancelled() {
        if let Some(pause) = shared.pause() {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        let claimed = tokio::select! {
            _ = stop.cancelled() => break,
            claimed = client.claim_answer(&params) => claimed,
        };
        match claimed {
            Ok(claimed) => {
                if claimed.unknown_service
                    && !shared.warned_unknown_service.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        service = args.service,
                        "the broker says no job has named this service: check its name; \
                         waiting for work all the same"
                    );
                }
                for item in claimed.items {
                    work(&client, &args, item, &shared).await;
                }
            }
            Err(ClientError::Api { status, code, message })
                if status == reqwest::StatusCode::GONE =>
            {
                shared.halt(format!(
                    "the broker shut querier {} down: {message} ({status}, {code})",
                    args.querier
                ));
                break;
            }
            Err(error) if error.is_untrusted_certificate() => {
                shared.halt(error.to_string());
                break;
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
async fn work(client: &Client, args: &WorkerArgs, item: WorkItem, shared: &Shared) {
    let (id, attempt) = (item.id.0, item.attempt);
    let report = tokio::select! {
        ran = run_command(&args.command, &item) => match ran {
            Ran::Report(report) => report,
            Ran::CannotStart(error) => {
                // No item can succeed: stop rather than fail the backlog. The item goes back
                // to the queue for a worker whose command runs.
                shared.halt(format!("{error}; every item would fail"));
                Report::Failed { attempt, error: Some(error), retryable: true }
            }
        },
        lost = heartbeat(client, id, attempt, first_heartbeat(&item, args.heartbeat), args.heartbeat) => {
            // The command is killed when its future is dropped here.
            tracing::warn!(item = id, attempt, reason = %lost, "gave up the item");
            return;
        }
    };
    for try_number in 1..=REPORT_TRIES {
        match client.report(id, &report).await {
            Ok(answer) => {
                note_outcome(shared, &report);
                match &report {
                    Report::Failed { error, .. } => tracing::warn!(
                        item = id,
                        attempt,
                        status = ?answer.status,
                        error = error.as_deref().unwrap_or(""),
                        "reported a failure"
                    ),
                    _ => tracing::info!(item = id, attempt, status = ?answer.status, "reported"),
                }
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

/// Counts the command's failures in a row, and says so when the worker starts pausing.
fn note_outcome(shared: &Shared, report: &Report) {
    let Report::Failed { error, .. } = report else {
        shared.failures_in_a_row.store(0, Ordering::Relaxed);
        return;
    };
    let failures = shared.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
    if failures >= FAILURES_BEFORE_PAUSE {
        let pause = shared.pause().unwrap_or_default();
        tracing::error!(
            failures,
            last_error = error.as_deref().unwrap_or(""),
            "the command failed on {failures} items in a row; pausing {pause:?} before taking \
             more work"
        );
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

/// How a run of the command went.
enum Ran {
    /// It ran: the report to send.
    Report(Report),
    /// It could not be started (missing, not executable): no item can succeed.
    CannotStart(String),
}

/// The environment variable that hands the command its item's W3C traceparent.
const TRACEPARENT: &str = "TRACEPARENT";

/// The command's verdict on the item.
async fn run_command(command: &[String], item: &WorkItem) -> Ran {
    let attempt = item.attempt;
    let failed = |error: String, retryable: bool| {
        Ran::Report(Report::Failed { attempt, error: Some(error), retryable })
    };
    let Some((program, arguments)) = command.split_first() else {
        return Ran::CannotStart("no command to run".to_owned());
    };
    let input = match serde_json::to_vec(item) {
        Ok(input) => input,
        Err(error) => return failed(format!("cannot encode the item: {error}"), false),
    };
    let mut command = Command::new(program);
    // The producer's trace, for the command to continue; never one the worker inherited.
    match &item.traceparent {
        Some(traceparent) => command.env(TRACEPARENT, traceparent),
        None => command.env_remove(TRACEPARENT),
    };
    let child = command
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            return Ran::CannotStart(format!("cannot start {program}: {error}"));
        }
        // Anything else (out of processes or memory) may pass.
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
        Ok(Value::Array(results)) => {
            Ran::Report(Report::Successful { attempt, results, component: None })
        }
        _ => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let end = (0..=OUTPUT_QUOTE_BYTES.min(stdout.len()))
                .rev()
                .find(|&at| stdout.is_char_boundary(at))
                .unwrap_or(0);
            let more = if end < stdout.len() { "…" } else { "" };
            failed(
                format!(
                    "the command exited 0 but its output is not a JSON array; it began {:?}{more}",
                    &stdout[..end]
                ),
                false,
            )
        }
    }
}
