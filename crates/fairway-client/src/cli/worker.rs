//! `fairway worker`: long-polls for items of one service and runs a command per item, so that
//! any executable becomes a fairway service. On SIGTERM or SIGINT it takes no more work, shuts
//! its querier down (which ends its waiting work requests at the broker), finishes what it
//! holds and what those requests still hand it, reports it all, and exits; after
//! --stop-timeout it exits anyway, naming the items it could not report. A broker that cannot
//! answer (503, 429, no connection) is asked again only after a pause that grows.
//!
//! A finished item's report is kept until a broker takes it, or until the item's lease has
//! ended (then the broker has handed the item to another worker): the item's lease is kept
//! alive by heartbeats meanwhile, so that a broker away for a while costs no work done twice.
//!
//! A broken command must not fail the whole backlog: a command that cannot be started at all
//! stops the worker (exit non-zero), and a command that fails on several items in a row makes
//! it pause before taking more, doubling the pause while the failures go on. It also exits when
//! the broker says its querier was shut down (410).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::{client, CliError};
use crate::args::WorkerArgs;
use crate::{ClaimParams, Client, ClientError, Report, ReportAnswer};
use fairway_api::model::WorkItem;

/// How much of a failed command's standard error goes into the item's error.
const ERROR_TAIL_BYTES: usize = 2048;

/// The first pause after the broker could not answer; each failure in a row doubles it, with
/// jitter, up to [`LONGEST_BACKOFF`]. A longer Retry-After from the broker is waited out whole.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const LONGEST_BACKOFF: Duration = Duration::from_secs(30);

/// The longest pause between two tries of a report: a report is small, and the sooner it lands
/// after a broker is back, the sooner its job goes on.
const LONGEST_REPORT_PAUSE: Duration = Duration::from_secs(2);

/// Retries of the querier's shutdown notice the broker did not answer.
const SHUTDOWN_RETRIES: usize = 4;

fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(FIRST_BACKOFF)
        .with_max_delay(LONGEST_BACKOFF)
        .with_jitter()
}

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
    unavailable: Mutex<Unavailable>,
    /// Held by the one slot that asks a failing broker whether it is back, so that a worker
    /// facing a broker that answers nothing but errors sends one request per pause, whatever
    /// its concurrency.
    probe: tokio::sync::Mutex<()>,
    /// The items taken and not yet reported, by id.
    held: Mutex<BTreeMap<i64, Held>>,
    /// Items that stopped being this worker's before their report landed: canceled, or their
    /// leases ended.
    given_up: AtomicU32,
    /// Items taken, for the last line.
    taken: AtomicU32,
}

/// An item taken and not yet reported.
struct Held {
    attempt: i32,
    /// When its lease ends, as far as the worker knows: the claim's, then each heartbeat's.
    lease_ends: DateTime<Utc>,
    /// How long the claim leased it for, for a broker whose heartbeats do not say.
    lease: chrono::Duration,
}

/// When the broker may be asked again after it could not answer.
struct Unavailable {
    failing: bool,
    until: tokio::time::Instant,
    pauses: ExponentialBackoff,
}

impl Shared {
    /// Stops every slot, and makes the worker exit with `reason` once they finished.
    fn halt(&self, reason: String) {
        if self.fatal.set(reason.clone()).is_ok() {
            tracing::error!("stopping: {reason}");
        }
        self.stop.cancel();
    }

    /// Records that the broker could not answer a request; returns the pause before the next.
    /// Failures of requests sent before the pause began do not lengthen it.
    fn broker_failed(&self, retry_after: Option<Duration>) -> Duration {
        let mut unavailable = self.unavailable.lock().unwrap_or_else(PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        unavailable.failing = true;
        if now >= unavailable.until {
            let pause = unavailable.pauses.next().unwrap_or(LONGEST_BACKOFF);
            unavailable.until = now + pause.max(retry_after.unwrap_or_default());
        }
        unavailable.until - now
    }

    /// The broker answered: the next failure starts from the shortest pause.
    fn broker_answered(&self) {
        let mut unavailable = self.unavailable.lock().unwrap_or_else(PoisonError::into_inner);
        unavailable.failing = false;
        unavailable.pauses = backoff().without_max_times().build();
    }

    /// Whether the last request failed, and when the broker may be asked again.
    fn broker_state(&self) -> (bool, tokio::time::Instant) {
        let unavailable = self.unavailable.lock().unwrap_or_else(PoisonError::into_inner);
        (unavailable.failing, unavailable.until)
    }

    fn hold(&self, item: &WorkItem) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let held = Held {
            attempt: item.attempt,
            lease_ends: item.lease_expires_at,
            lease: item.lease_expires_at - Utc::now(),
        };
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(item.id.0, held);
    }

    /// A heartbeat went through: the lease ends at `until`, or (from a broker that does not
    /// say) a whole lease from now at the earliest.
    fn lease_extended(&self, id: i64, until: Option<DateTime<Utc>>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(item) = held.get_mut(&id) {
            item.lease_ends = until.unwrap_or(item.lease_ends.max(Utc::now() + item.lease));
        }
    }

    /// When the item's next heartbeat goes: after `every`, or once half of what is left of its
    /// lease has passed if that is sooner (a broker with --first-lease hands out short first
    /// leases, which the first heartbeat extends).
    fn first_heartbeat(&self, id: i64, every: Duration) -> Duration {
        let left = self.lease_ends(id).map(|ends| (ends - Utc::now()).to_std().unwrap_or_default());
        left.map_or(every, |left| every.min(left / 2))
    }

    fn lease_ends(&self, id: i64) -> Option<DateTime<Utc>> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .map(|item| item.lease_ends)
    }

    /// The item is reported, or no longer this worker's to report.
    fn let_go(&self, id: i64) {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    /// The items still held, in words: for the last line of a worker that stops without having
    /// reported them.
    fn still_held(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter()
            .map(|(id, item)| {
                let ends = item.lease_ends.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                format!("item {id} (attempt {}, lease ends {ends})", item.attempt)
            })
            .collect()
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
    let querier = args.querier.clone().unwrap_or_else(default_querier);
    let shared = Arc::new(Shared {
        stop: CancellationToken::new(),
        fatal: OnceLock::new(),
        failures_in_a_row: AtomicU32::new(0),
        warned_unknown_service: AtomicBool::new(false),
        unavailable: Mutex::new(Unavailable {
            failing: false,
            until: tokio::time::Instant::now(),
            pauses: backoff().without_max_times().build(),
        }),
        probe: tokio::sync::Mutex::new(()),
        held: Mutex::new(BTreeMap::new()),
        given_up: AtomicU32::new(0),
        taken: AtomicU32::new(0),
    });
    tracing::info!(
        service = args.service,
        querier,
        broker = args.broker.url,
        concurrency = args.concurrency,
        "worker started"
    );
    tokio::spawn(stop_on_signal(shared.stop.clone()));
    let leave = tokio::spawn(leave_when_stopped(client.clone(), querier.clone(), shared.clone()));
    let slots: Vec<_> = (0..args.concurrency)
        .map(|slot| {
            let slot =
                work_slot(client.clone(), args.clone(), querier.clone(), slot, shared.clone());
            tokio::spawn(slot)
        })
        .collect();
    let finished = async {
        for slot in slots {
            // A slot's panic is a bug; the others still finish what they hold.
            if let Err(error) = slot.await {
                tracing::error!(%error, "a worker slot stopped unexpectedly");
            }
        }
    };
    let timed_out = tokio::select! {
        () = finished => false,
        () = stop_timeout(&shared.stop, args.stop_timeout) => true,
    };
    // Every slot stopped, or the stop came and its time ran out.
    match tokio::time::timeout(LEAVE_TIMEOUT, leave).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "shutting the querier down stopped unexpectedly"),
        Err(_) => tracing::warn!("the querier's shutdown notice got no answer in time"),
    }
    let unreported = shared.still_held();
    if timed_out && !unreported.is_empty() {
        let message = format!(
            "stopped after --stop-timeout ({:?}) with {} items not reported, each to run again \
             once its lease ends: {}",
            args.stop_timeout,
            unreported.len(),
            unreported.join(", ")
        );
        tracing::error!("{message}");
        return Err(CliError::Found(message));
    }
    let taken = shared.taken.load(Ordering::Relaxed);
    match shared.given_up.load(Ordering::Relaxed) {
        0 => tracing::info!(taken, "stopped: every item taken was reported"),
        given_up => tracing::warn!(
            taken,
            given_up,
            "stopped: {given_up} of the {taken} items taken were not reported: they stopped being \
             this worker's first (canceled, or their leases ended)"
        ),
    }
    match shared.fatal.get() {
        Some(reason) => Err(CliError::Found(reason.clone())),
        None => Ok(()),
    }
}

/// Longest the worker waits, as it exits, for its querier's shutdown notice to be answered.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Ends `timeout` after the stop.
async fn stop_timeout(stop: &CancellationToken, timeout: Duration) {
    stop.cancelled().await;
    tokio::time::sleep(timeout).await;
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

/// The querier a worker asks as unless told: the host name (in Kubernetes, the pod's) and the
/// process id, as the Python worker's, so that each worker process is a querier of its own.
fn default_querier() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|host| host.into_string().ok());
    format!("{}-{}", host.as_deref().unwrap_or("worker"), std::process::id())
}

/// Once the worker stops, says that its querier is leaving: the broker ends the querier's
/// waiting work requests (their slots then see 410), hands it no more work, and takes it out
/// of its tenants' shards once it holds no lease, so that no shard waits on a process gone.
async fn leave_when_stopped(client: Client, querier: String, shared: Arc<Shared>) {
    shared.stop.cancelled().await;
    let left = (|| client.shut_down_querier(&querier))
        .retry(backoff().with_max_times(SHUTDOWN_RETRIES))
        .when(ClientError::is_transient)
        .await;
    match left {
        Ok(()) => tracing::info!(querier, "querier shut down"),
        // Never seen by the broker (no work request got through): nothing to leave.
        Err(ClientError::Api { status, .. }) if status == reqwest::StatusCode::NOT_FOUND => {}
        Err(error) => tracing::warn!(
            querier,
            %error,
            "cannot shut the querier down; the broker forgets it after its forget delay"
        ),
    }
}

/// One slot: claims an item, works it, reports it, until told to stop. A work request under
/// way when the stop comes is not abandoned, since the broker may have leased an item for it
/// already: the querier's shutdown ends it, and whatever it brings is worked and reported.
async fn work_slot(
    client: Client,
    args: WorkerArgs,
    querier: String,
    slot: u32,
    shared: Arc<Shared>,
) {
    let stop = &shared.stop;
    let params = ClaimParams {
        service: &args.service,
        querier: &querier,
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
        let (failing, _) = shared.broker_state();
        let probe = match failing {
            true => tokio::select! {
                _ = stop.cancelled() => break,
                probe = shared.probe.lock() => Some(probe),
            },
            false => None,
        };
        let (_, available_at) = shared.broker_state();
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(available_at) => {}
        }
        let claimed = client.claim_answer(&params).await;
        drop(probe);
        match claimed {
            Ok(claimed) => {
                shared.broker_answered();
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
            // The worker's own shutdown, ending this request.
            Err(ClientError::Api { status, .. })
                if status == reqwest::StatusCode::GONE && stop.is_cancelled() =>
            {
                break
            }
            Err(ClientError::Api { status, code, message, .. })
                if status == reqwest::StatusCode::GONE =>
            {
                shared.halt(format!(
                    "the broker shut querier {querier} down: {message} ({status}, {code})"
                ));
                break;
            }
            Err(error) if error.is_untrusted_certificate() => {
                shared.halt(error.to_string());
                break;
            }
            Err(error) => {
                let pause = shared.broker_failed(error.retry_after());
                tracing::warn!(%error, ?pause, "asking for work failed; asking again after a pause");
            }
        }
    }
}

/// Runs the command on one item, heartbeating while it runs, and reports how it ended.
async fn work(client: &Client, args: &WorkerArgs, item: WorkItem, shared: &Shared) {
    let (id, attempt) = (item.id.0, item.attempt);
    shared.hold(&item);
    let first = shared.first_heartbeat(id, args.heartbeat);
    let report = tokio::select! {
        ran = run_command(&args.command, &item) => match ran {
            Ran::Report(report) => report,
            Ran::CannotStart(error) => {
                // No item can succeed: stop rather than fail the backlog. The item is handed
                // back, its attempt not counted, for a worker whose command runs.
                shared.halt(format!("{error}; every item would fail"));
                Report::Released { attempt, reason: Some(error) }
            }
        },
        lost = heartbeat(client, id, attempt, first, args.heartbeat, shared) => {
            // The command is killed when its future is dropped here.
            tracing::warn!(item = id, attempt, reason = %lost, "gave up the item");
            shared.given_up.fetch_add(1, Ordering::Relaxed);
            shared.let_go(id);
            return;
        }
    };
    // The lease stays alive while the report waits for a broker. A heartbeat refused meanwhile
    // says only that the attempt is no longer current, which a report that landed unanswered
    // also makes it: the report, sent again, tells which.
    let first = shared.first_heartbeat(id, args.heartbeat);
    let keep_alive = async {
        heartbeat(client, id, attempt, first, args.heartbeat, shared).await;
        std::future::pending::<Infallible>().await
    };
    let delivery = tokio::select! {
        delivery = deliver(client, id, &report, shared) => delivery,
        never = keep_alive => match never {},
    };
    shared.let_go(id);
    match delivery {
        Delivery::Delivered(answer) => {
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
        }
        Delivery::Refused(error) => {
            shared.given_up.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(item = id, attempt, %error, "report refused: the item is no longer this worker's");
        }
        Delivery::LeaseEnded => {
            shared.given_up.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                item = id,
                attempt,
                "no broker took the report before the item's lease ended; the item runs again"
            );
        }
    }
}

/// What became of a report.
enum Delivery {
    Delivered(ReportAnswer),
    /// The broker refused it: the attempt is no longer current (canceled, or leased again).
    Refused(ClientError),
    /// No broker took it before the lease ended, and with it the worker's claim on the item.
    LeaseEnded,
}

/// Sends `report` until a broker answers it, backing off between tries (a broker's longer
/// Retry-After is waited out whole), and no later than the item's lease allows.
async fn deliver(client: &Client, id: i64, report: &Report, shared: &Shared) -> Delivery {
    let mut pauses = backoff().with_max_delay(LONGEST_REPORT_PAUSE).without_max_times().build();
    loop {
        let error = match client.report(id, report).await {
            Ok(answer) => return Delivery::Delivered(answer),
            Err(error) if !error.is_transient() => return Delivery::Refused(error),
            Err(error) => error,
        };
        let now = Utc::now();
        let left = shared.lease_ends(id).map(|ends| (ends - now).to_std().unwrap_or_default());
        if left == Some(Duration::ZERO) {
            return Delivery::LeaseEnded;
        }
        let pause =
            pauses.next().unwrap_or(LONGEST_BACKOFF).max(error.retry_after().unwrap_or_default());
        // One last try as the lease ends.
        let pause = left.map_or(pause, |left| pause.min(left));
        tracing::warn!(item = id, %error, ?pause, "report failed; keeping it to send again");
        tokio::time::sleep(pause).await;
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

/// Extends the lease after `first`, then every `every`, until the broker says the attempt is no
/// longer this worker's (a cancel, or a lease that expired); returns why.
async fn heartbeat(
    client: &Client,
    id: i64,
    attempt: i32,
    first: Duration,
    every: Duration,
    shared: &Shared,
) -> ClientError {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    loop {
        ticker.tick().await;
        match client.report(id, &Report::Running { attempt }).await {
            Ok(answer) => shared.lease_extended(id, answer.lease_expires_at),
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
