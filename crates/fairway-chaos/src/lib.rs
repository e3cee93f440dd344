//! `fairway chaos`: the fault suite (`make chaos`) and, with `--soak`, the soak run (`make
//! soak`). Test tooling, hidden from `--help`: it starts its own durable PostgreSQL cluster,
//! three `fairway serve` processes on it and a worker process (`fairway chaos-drive`), puts
//! work through them while it kills brokers, crashes PostgreSQL, kills a worker mid-command
//! and abandons long polls, then checks that every item succeeded exactly once.
//! docs/reliability.md describes what it injects and asserts.

pub mod args;
mod drive;
mod load;
mod soak;
mod sql;

pub use drive::run as drive;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use thiserror::Error;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::args::ChaosArgs;
use crate::sql::{
    CAP_PEAKS, ITEM_TOTALS, JOB_OUTCOMES, LOST_CLAIMS, LOST_ENDINGS, LOST_JOBS, WATCH_CAPS,
};
use drive::{Record, Refusal};
use fairway_api::model::JobStatus;
use fairway_broker::db::{self, DbError};
use fairway_client::{ClaimParams, Client, ClientError, Report};
use fairway_devdb::DevDbError;
use fairway_devdb::{EmbeddedError, EmbeddedPostgres};
use load::Load;

/// The services the worker process serves, one per worker in turn.
pub const SERVICES: [&str; 3] = ["chaos-a", "chaos-b", "chaos-c"];
/// A service no worker serves: only the abandoned long polls wait on it.
const IDLE_SERVICE: &str = "chaos-idle";
const DATABASE: &str = "fairway_chaos";
/// The cluster_name of the suite's primary and of its synchronous standby.
const PRIMARY_NAME: &str = "chaos_primary";
const STANDBY_NAME: &str = "chaos_standby";
/// Longest wait, after the primary is killed and the standby promoted, for every broker to be
/// ready on the new primary.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
const BROKERS: usize = 3;
/// Longest wait for a broker to answer /readyz after it starts.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How often a condition being awaited is looked at again.
const POLL: Duration = Duration::from_millis(100);
/// An asynchronous job is submitted this often under the fault suite.
const PACE: Duration = Duration::from_millis(150);
/// Per mille of claimed items whose worker dies holding them, until the faults end.
const DIE_PER_MILLE: u64 = 5;
/// Items a run makes at least, counting those its workflows make from results.
const MIN_ITEMS: i64 = 4_000;
/// Items completed before the first fault, so that it lands on flowing work.
const WARM_UP_ITEMS: i64 = 300;
/// Work that flows between two faults.
const BETWEEN_FAULTS: Duration = Duration::from_secs(3);
/// Long polls abandoned by their client.
const VANISHING_POLLS: usize = 4;
/// How long an abandoned long poll's client waits before closing the connection.
const VANISH_AFTER: Duration = Duration::from_secs(1);
/// The bound docs/reliability.md promises: an item claimed for a vanished long poll is ready again within it.
const VANISHED_BOUND: Duration = Duration::from_secs(10);
/// Clients closing long polls at random moments, for how long, and their longest patience.
const HASTY_CLIENTS: usize = 4;
const HASTY_FOR: Duration = Duration::from_secs(1);
const HASTY_MS: u64 = 30;
/// Longest the suite waits, after the faults, for every job to finish: past the lease of the
/// last dead worker's item, and then some.
const DRAIN_MARGIN: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum ChaosError {
    #[error(transparent)]
    Embedded(Box<EmbeddedError>),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    DevDb(#[from] DevDbError),
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the worker process's record: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Setup(String),
    #[error("{} check(s) failed:\n  - {}", .0.len(), .0.join("\n  - "))]
    Failed(Vec<String>),
}

impl From<EmbeddedError> for ChaosError {
    fn from(error: EmbeddedError) -> Self {
        Self::Embedded(Box::new(error))
    }
}

/// Milliseconds since the epoch: the suite and its worker process compare times by it.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_millis() as u64).unwrap_or(0)
}

/// Seeded draws (splitmix64), so that each worker's deaths and lost answers vary per run of
/// the same slot only by timing.
pub struct Dice(u64);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ now_ms())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    pub fn per_mille(&mut self, chance: u64) -> bool {
        self.below(1000) < chance
    }
}

pub async fn run(args: ChaosArgs) -> Result<(), ChaosError> {
    std::fs::create_dir_all(&args.out)?;
    // The processes append to their logs, across restarts; each run starts them afresh.
    for entry in std::fs::read_dir(&args.out)?.flatten() {
        if entry.path().extension().is_some_and(|extension| extension == "log") {
            std::fs::remove_file(entry.path())?;
        }
    }
    if args.soak {
        let server = EmbeddedPostgres::start(Some(&args.data_dir), args.pg_bin.as_deref()).await?;
        let outcome = soak::run(&args, &server).await;
        server.stop().await?;
        return outcome;
    }
    // A primary that waits for its one standby to confirm each commit, as production does.
    let mut server = EmbeddedPostgres::start_with_settings(
        Some(&args.data_dir),
        args.pg_bin.as_deref(),
        &[
            ("cluster_name", PRIMARY_NAME),
            ("synchronous_standby_names", STANDBY_NAME),
            ("synchronous_commit", "on"),
        ],
    )
    .await?;
    let standby =
        match EmbeddedPostgres::start_standby(&server, &args.standby_dir, STANDBY_NAME).await {
            Ok(standby) => standby.ephemeral(),
            Err(error) => {
                server.stop().await?;
                return Err(error.into());
            }
        };
    let outcome = suite(&args, &mut server, &standby).await;
    // The killed primary is never started again; stop has nothing to do for it then.
    let stopped = server.stop().await;
    standby.stop().await?;
    stopped?;
    outcome
}

/// `count` of `urls`, from the one at `first` on, wrapping round: the brokers a client given
/// several goes through, in order.
pub fn starting_at(urls: &[String], first: usize, count: usize) -> Vec<String> {
    (0..count.min(urls.len())).map(|n| urls[(first + n) % urls.len()].clone()).collect()
}

/// The broker processes, each on a fixed port so that a restarted one is where it was.
pub struct Brokers {
    exe: PathBuf,
    database_url: String,
    out: PathBuf,
    extra: Vec<String>,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    /// Those stopped for good, never started again.
    gone: Vec<bool>,
    /// One client per broker that asks it alone: whether it is ready.
    probes: Vec<Client>,
    /// One client per broker that starts there and goes on to the others while one is away,
    /// as a worker given every broker's URL does.
    pub clients: Vec<Client>,
}

impl Brokers {
    /// Starts `BROKERS` brokers on database `DATABASE`, freshly made, with `extra` flags.
    pub async fn start(
        args: &ChaosArgs,
        server: &EmbeddedPostgres,
        database_url: String,
        extra: &[String],
    ) -> Result<Self, ChaosError> {
        let admin = fairway_devdb::parse_config(&server.connection_string("postgres"))?;
        fairway_devdb::recreate_database(&admin, DATABASE).await?;
        let mut ports = Vec::with_capacity(BROKERS);
        for _ in 0..BROKERS {
            ports.push(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        }
        let urls: Vec<String> =
            ports.iter().map(|port| format!("http://127.0.0.1:{port}")).collect();
        let probes = urls.iter().map(|url| Client::new(url, None)).collect::<Result<_, _>>()?;
        let clients = (0..BROKERS)
            .map(|first| Client::new(&starting_at(&urls, first, BROKERS).join(","), None))
            .collect::<Result<_, _>>()?;
        let mut brokers = Self {
            exe: std::env::current_exe()?,
            database_url,
            out: args.out.clone(),
            extra: [
                vec!["--lease".to_owned(), humantime::format_duration(args.lease).to_string()],
                extra.to_vec(),
            ]
            .concat(),
            children: (0..BROKERS).map(|_| None).collect(),
            gone: vec![false; BROKERS],
            ports,
            probes,
            clients,
        };
        for index in 0..BROKERS {
            brokers.spawn(index)?;
        }
        for index in 0..BROKERS {
            brokers.ready(index).await?;
        }
        Ok(brokers)
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|port| format!("http://127.0.0.1:{port}")).collect()
    }

    fn spawn(&mut self, index: usize) -> Result<(), ChaosError> {
        let log = log_file(&self.out.join(format!("broker-{index}.log")))?;
        let child = Command::new(&self.exe)
            .arg("serve")
            .args(["--bind", &format!("127.0.0.1:{}", self.ports[index])])
            .args(["--database-url", &self.database_url])
            // Three brokers stay well inside PostgreSQL's default 100 connections.
            .args(["--pool-size", "16", "--reap-interval", "500ms", "--shutdown-timeout", "5s"])
            // A claim no worker read comes back within 10 s (8 s, then a reaper pass), while a
            // report held up by the PostgreSQL crash still has time to arrive.
            .args(["--first-lease", "8s"])
            .args(&self.extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.children[index] = Some(child);
        Ok(())
    }

    /// Waits until broker `index` answers /readyz; returns how long that took.
    pub async fn ready(&self, index: usize) -> Result<Duration, ChaosError> {
        self.ready_within(index, READY_LIMIT).await
    }

    /// As [`Brokers::ready`], giving up after `limit`.
    async fn ready_within(&self, index: usize, limit: Duration) -> Result<Duration, ChaosError> {
        let started = Instant::now();
        loop {
            match self.probes[index].ready().await {
                Ok(()) => return Ok(started.elapsed()),
                Err(error) if started.elapsed() > limit => {
                    return Err(ChaosError::Setup(format!(
                        "broker {index} never became ready: {error}"
                    )))
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    pub fn pid(&self, index: usize) -> Option<u32> {
        self.children[index].as_ref().and_then(Child::id)
    }

    /// `kill -9`, then starts it again on the same port.
    async fn kill_and_restart(&mut self, index: usize) -> Result<(), ChaosError> {
        if let Some(mut child) = self.children[index].take() {
            child.start_kill()?;
            child.wait().await?;
        }
        self.spawn(index)
    }

    /// `kill -9`, and never started again.
    async fn stop_for_good(&mut self, index: usize) -> Result<(), ChaosError> {
        if let Some(mut child) = self.children[index].take() {
            child.start_kill()?;
            child.wait().await?;
        }
        self.gone[index] = true;
        Ok(())
    }

    /// The brokers not stopped for good.
    fn live(&self) -> Vec<usize> {
        (0..BROKERS).filter(|index| !self.gone[*index]).collect()
    }

    /// SIGTERM to each, and waits for them to exit.
    pub async fn stop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        }
        for child in self.children.iter_mut().flatten() {
            let _ = child.wait().await;
        }
    }
}

fn signal(pid: Option<u32>, signal: nix::sys::signal::Signal) {
    if let Some(pid) = pid.and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

fn log_file(path: &Path) -> Result<std::fs::File, ChaosError> {
    Ok(std::fs::OpenOptions::new().create(true).append(true).open(path)?)
}

/// The worker process, `fairway chaos-drive`.
pub struct Drive {
    child: Child,
    record: PathBuf,
}

impl Drive {
    pub fn start(
        brokers: &Brokers,
        args: &ChaosArgs,
        die_per_mille: u64,
    ) -> Result<Self, ChaosError> {
        let record = args.out.join("record.json");
        let log = log_file(&args.out.join("drive.log"))?;
        let child = Command::new(std::env::current_exe()?)
            .arg("chaos-drive")
            .args(["--url", &brokers.urls().join(",")])
            .args(["--workers", &args.workers.to_string()])
            .args(["--die-per-mille", &die_per_mille.to_string()])
            .arg("--record")
            .arg(&record)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { child, record })
    }

    async fn order(&mut self, order: &str) -> Result<(), ChaosError> {
        if let Some(stdin) = self.child.stdin.as_mut() {
            stdin.write_all(format!("{order}\n").as_bytes()).await?;
            stdin.flush().await?;
        }
        Ok(())
    }

    /// No more workers die.
    pub async fn calm(&mut self) -> Result<(), ChaosError> {
        self.order("calm").await
    }

    /// Stops the workers and reads what they saw.
    pub async fn finish(mut self) -> Result<Record, ChaosError> {
        self.order("stop").await?;
        let status = self.child.wait().await?;
        if !status.success() {
            return Err(ChaosError::Setup(format!("the worker process failed ({status})")));
        }
        Ok(serde_json::from_slice(&std::fs::read(&self.record)?)?)
    }
}

/// Items in the database: all, successful, and attempts beyond the first.
pub async fn item_totals(pool: &deadpool_postgres::Pool) -> Result<(i64, i64, i64), ChaosError> {
    let client = pool.get().await?;
    let row = sql::query_one(&client, ITEM_TOTALS, &[]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

/// Waits until more than `items` items are successful; returns when, or None after `limit`.
async fn progress_after(
    pool: &deadpool_postgres::Pool,
    items: i64,
    limit: Duration,
) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if matches!(item_totals(pool).await, Ok((_, successful, _)) if successful > items) {
            return Some(Instant::now());
        }
        tokio::time::sleep(POLL).await;
    }
    None
}

/// One fault and how long the system took to recover from it.
#[derive(Debug, Serialize)]
struct Fault {
    fault: String,
    /// Seconds from the injection until what `recovered` names.
    recovered_s: Option<f64>,
    recovered: String,
}

#[derive(Debug, Serialize)]
struct Figures {
    duration_s: f64,
    jobs: i64,
    items: i64,
    claims: usize,
    reattempts: i64,
    abandoned_by_dying_workers: u64,
    released_by_workers: u64,
    report_repeats: u64,
    repeats_accepted: usize,
    unanswered_requests: usize,
    status_503: usize,
    status_503_after_faults: usize,
    other_errors: usize,
    faults: Vec<Fault>,
    failover: FailoverFigures,
}

/// What the failover cost: from the kill of the primary to the first claim answered on the
/// promoted standby, and to every broker ready; the 503s answered in between.
#[derive(Debug, Serialize)]
struct FailoverFigures {
    promoted_s: f64,
    first_claim_s: Option<f64>,
    all_ready_s: f64,
    status_503: usize,
}

async fn suite(
    args: &ChaosArgs,
    server: &mut EmbeddedPostgres,
    standby: &EmbeddedPostgres,
) -> Result<(), ChaosError> {
    let started = Instant::now();
    let failover_url = EmbeddedPostgres::failover_connection_string(&[server, standby], DATABASE);
    let broker_url = if args.single_host_url {
        server.connection_string(DATABASE)
    } else {
        failover_url.clone()
    };
    let mut brokers = Brokers::start(args, server, broker_url, &[]).await?;
    // The suite's own reads follow the primary too, to check the promoted database.
    let pool = db::pool::connect(&fairway_devdb::parse_config(&failover_url)?, 2)?;
    let load = Load::new(brokers.clients.clone());
    pool.get().await?.batch_execute(WATCH_CAPS).await?;
    load::set_policies(&brokers.clients[0]).await?;
    let mut drive = Drive::start(&brokers, args, DIE_PER_MILLE)?;
    let producers = load.start(PACE);
    println!(
        "chaos: 3 brokers, {} workers, lease {}",
        args.workers,
        humantime::format_duration(args.lease)
    );
    if progress_after(&pool, WARM_UP_ITEMS, READY_LIMIT).await.is_none() {
        return Err(ChaosError::Setup("no work flowed before the first fault".to_owned()));
    }

    let mut faults = Vec::new();
    for index in 0..BROKERS {
        let (_, done, _) = item_totals(&pool).await?;
        let killed = Instant::now();
        brokers.kill_and_restart(index).await?;
        let ready = brokers.ready(index).await?;
        faults.push(report_fault(
            format!("kill -9 broker {index}"),
            Some(ready),
            "restarted and ready",
        ));
        let flowing = progress_after(&pool, done, READY_LIMIT).await;
        faults.push(report_fault(
            format!("kill -9 broker {index}"),
            flowing.map(|at| at - killed),
            "items completing again",
        ));
        tokio::time::sleep(BETWEEN_FAULTS).await;
    }

    // A broker gone for good: the workers and producers it served carry on with the other
    // broker they were given.
    let (_, done, _) = item_totals(&pool).await?;
    let gone = Instant::now();
    brokers.stop_for_good(BROKERS - 1).await?;
    let flowing = progress_after(&pool, done, READY_LIMIT).await;
    faults.push(report_fault(
        format!("kill -9 broker {} for good", BROKERS - 1),
        flowing.map(|at| at - gone),
        "items completing again",
    ));
    tokio::time::sleep(BETWEEN_FAULTS).await;

    let (_, done, _) = item_totals(&pool).await?;
    let crashed = Instant::now();
    server.restart_immediately().await?;
    faults.push(report_fault(
        "PostgreSQL restart -m immediate".to_owned(),
        Some(crashed.elapsed()),
        "PostgreSQL accepting connections",
    ));
    for index in brokers.live() {
        brokers.ready(index).await?;
    }
    faults.push(report_fault(
        "PostgreSQL restart -m immediate".to_owned(),
        Some(crashed.elapsed()),
        "every broker ready",
    ));
    let flowing = progress_after(&pool, done, READY_LIMIT).await;
    faults.push(report_fault(
        "PostgreSQL restart -m immediate".to_owned(),
        flowing.map(|at| at - crashed),
        "items completing again",
    ));
    tokio::time::sleep(BETWEEN_FAULTS).await;

    let killed_worker = tokio::spawn(kill_worker_mid_command(
        brokers.urls()[0].clone(),
        brokers.clients[0].clone(),
        args.out.clone(),
    ));
    let vanished = vanishing_long_polls(&load).await;
    let hasty = hasty_clients(&load).await;
    let killed_worker = killed_worker
        .await
        .map_err(|error| ChaosError::Setup(format!("the worker kill failed: {error}")))??;
    faults.push(report_fault(
        "worker kill -9 mid-command".to_owned(),
        Some(killed_worker),
        "its leases released (lease expiry)",
    ));
    faults.push(report_fault(
        format!("{VANISHING_POLLS} long polls closed early"),
        vanished.as_ref().ok().copied(),
        "their items claimable again",
    ));
    let (orphaned, hasty_record) = hasty;
    faults.push(report_fault(
        format!("long polls closed mid-claim ({} leases left)", orphaned.0),
        Some(orphaned.1),
        "their leases released",
    ));

    // The failover, last: kill -9 of the primary's postmaster under load, then the standby
    // promoted; the old primary is never started again.
    let killed_ms = now_ms();
    let killed = Instant::now();
    server.kill()?;
    standby.promote().await?;
    let promoted = killed.elapsed();
    let promoted_ms = now_ms();
    faults.push(report_fault(
        "primary kill -9, standby promoted".to_owned(),
        Some(promoted),
        "standby promoted",
    ));
    for index in brokers.live() {
        if let Err(error) = brokers.ready_within(index, FAILOVER_LIMIT).await {
            brokers.stop().await;
            return Err(ChaosError::Failed(vec![format!(
                "after the primary was killed and the standby promoted: {error}"
            )]));
        }
    }
    let all_ready = killed.elapsed();
    faults.push(report_fault(
        "primary kill -9, standby promoted".to_owned(),
        Some(all_ready),
        "every broker ready",
    ));
    let flowing = progress_after(&pool, item_totals(&pool).await?.1, READY_LIMIT).await;
    faults.push(report_fault(
        "primary kill -9, standby promoted".to_owned(),
        flowing.map(|at| at - killed),
        "items completing again",
    ));
    // Every broker is back on the new primary: from here on no 503 is excused.
    let faults_end = now_ms();
    drive.calm().await?;
    // Faults that heal fast leave a short run: the work goes on, without faults, until the
    // run has made its few thousand items.
    let calm_since = Instant::now();
    while calm_since.elapsed() < READY_LIMIT {
        if matches!(item_totals(&pool).await, Ok((items, ..)) if items >= MIN_ITEMS) {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    load.stop.cancel();
    for producer in producers {
        let _ = producer.await;
    }

    // Every job the suite submitted must finish; the last dead worker's item waits out a lease.
    let deadline = Instant::now() + args.lease + DRAIN_MARGIN;
    let mut failures = Vec::new();
    let tracked = load.tracked();
    let mut unfinished = 0;
    let waiter = Load::new(brokers.clients.clone());
    for job in &tracked {
        match waiter.wait_for(job.job, Some(deadline)).await {
            Some(document) => {
                if document.status != JobStatus::Successful {
                    failures.push(format!("job {} ended {}", job.job.0, document.status.as_str()));
                }
                let totals: Vec<i64> = document.steps.iter().map(|step| step.total).collect();
                if totals != job.steps {
                    failures.push(format!(
                        "job {} has {totals:?} items per step, not {:?}: a success was applied twice or lost",
                        job.job.0, job.steps
                    ));
                }
            }
            None => unfinished += 1,
        }
    }
    if unfinished > 0 {
        failures.push(format!(
            "{unfinished} of {} jobs had not finished after the drain",
            tracked.len()
        ));
    }
    let record = drive.finish().await?;
    let outcomes = job_outcomes(&pool).await?;
    for (status, count) in &outcomes {
        if status != "successful" {
            failures.push(format!("{count} job(s) in the database ended {status}"));
        }
    }
    failures.extend(lost_acknowledged(&pool, &tracked, &record).await?);
    failures.extend(cap_breaches(&pool).await?);
    let consistency = brokers.clients[0].consistency().await?;
    if !consistency.consistent {
        failures.push(format!(
            "/admin/consistency found {} mismatch(es): {:?}",
            consistency.mismatches.len(),
            consistency.mismatches
        ));
    }
    match &vanished {
        Ok(ready_again) if *ready_again > VANISHED_BOUND => failures.push(format!(
            "items claimed for vanished long polls were claimable again only after {:.1} s (bound {} s)",
            ready_again.as_secs_f64(),
            VANISHED_BOUND.as_secs()
        )),
        Ok(_) => {}
        Err(problem) => failures.push(problem.clone()),
    }
    if orphaned.1 > VANISHED_BOUND {
        failures.push(format!(
            "{} item(s) claimed for long polls closed mid-claim stayed leased {:.1} s (bound {} s)",
            orphaned.0,
            orphaned.1.as_secs_f64(),
            VANISHED_BOUND.as_secs()
        ));
    }
    let mut record = record;
    record.claims.extend(hasty_record.claims);
    record.accepted.extend(hasty_record.accepted);
    record.refused.extend(hasty_record.refused);
    let mut refused = record.refused.clone();
    refused.extend(load.refusals());
    failures.extend(check_record(&record, &refused, faults_end));
    brokers.stop().await;

    let (items, _, reattempts) = item_totals(&pool).await?;
    let failover = FailoverFigures {
        promoted_s: promoted.as_secs_f64(),
        // Only the promoted standby can have answered a claim received after its promotion.
        first_claim_s: record
            .claims
            .iter()
            .map(|claim| claim.at_ms)
            .filter(|at_ms| *at_ms >= promoted_ms)
            .min()
            .map(|at_ms| at_ms.saturating_sub(killed_ms) as f64 / 1000.0),
        all_ready_s: all_ready.as_secs_f64(),
        status_503: refused
            .iter()
            .filter(|refusal| refusal.status == 503 && refusal.at_ms >= killed_ms)
            .count(),
    };
    let figures = Figures {
        duration_s: started.elapsed().as_secs_f64(),
        jobs: outcomes.iter().map(|(_, count)| count).sum(),
        items,
        claims: record.claims.len(),
        reattempts,
        abandoned_by_dying_workers: record.abandoned,
        released_by_workers: record.released,
        report_repeats: record.repeats,
        repeats_accepted: record.accepted.iter().filter(|accepted| accepted.repeat).count(),
        unanswered_requests: refused.iter().filter(|refusal| refusal.status == 0).count(),
        status_503: refused.iter().filter(|refusal| refusal.status == 503).count(),
        status_503_after_faults: refused
            .iter()
            .filter(|refusal| refusal.status == 503 && refusal.sent_ms > faults_end)
            .count(),
        other_errors: refused
            .iter()
            .filter(|refusal| refusal.status != 0 && refusal.status != 503)
            .count(),
        faults,
        failover,
    };
    print_figures(&figures);
    std::fs::write(args.out.join("figures.json"), serde_json::to_vec_pretty(&figures)?)?;
    pool.close();
    if failures.is_empty() {
        println!("chaos: every check passed");
        Ok(())
    } else {
        Err(ChaosError::Failed(failures))
    }
}

/// What the promoted database lacks of what the brokers acknowledged: jobs whose submission
/// was answered 2xx, claims' leases, accepted successes. Synchronous replication promises none.
async fn lost_acknowledged(
    pool: &deadpool_postgres::Pool,
    tracked: &[load::Tracked],
    record: &Record,
) -> Result<Vec<String>, ChaosError> {
    let client = pool.get().await?;
    let mut failures = Vec::new();
    let jobs: Vec<uuid::Uuid> = tracked.iter().map(|job| job.job.0).collect();
    let lost = sql::query(&client, LOST_JOBS, &[&jobs]).await?;
    if let Some(first) = lost.first() {
        let job: uuid::Uuid = first.try_get(0)?;
        failures.push(format!(
            "{} acknowledged job(s) are not in the promoted database, e.g. {job}",
            lost.len()
        ));
    }
    let pairs = |pairs: Vec<(i64, i32)>| -> (Vec<i64>, Vec<i32>) { pairs.into_iter().unzip() };
    let (items, attempts) =
        pairs(record.claims.iter().map(|claim| (claim.item, claim.attempt)).collect());
    let lost = sql::query(&client, LOST_CLAIMS, &[&items, &attempts]).await?;
    if let Some(first) = lost.first() {
        let (item, attempt): (i64, i32) = (first.try_get(0)?, first.try_get(1)?);
        failures.push(format!(
            "{} acknowledged claim(s) have no lease in the promoted database, e.g. item {item} \
             attempt {attempt}",
            lost.len()
        ));
    }
    let (items, attempts) =
        pairs(record.accepted.iter().map(|accepted| (accepted.item, accepted.attempt)).collect());
    let lost = sql::query(&client, LOST_ENDINGS, &[&items, &attempts]).await?;
    if let Some(first) = lost.first() {
        let (item, attempt): (i64, i32) = (first.try_get(0)?, first.try_get(1)?);
        failures.push(format!(
            "{} accepted success(es) are not in the promoted database, e.g. item {item} \
             attempt {attempt}",
            lost.len()
        ));
    }
    Ok(failures)
}

/// The most items each capped user, tenant and service had running, as the database recorded
/// it (watch_caps.sql), printed; a peak past its cap is a failure.
async fn cap_breaches(pool: &deadpool_postgres::Pool) -> Result<Vec<String>, ChaosError> {
    let client = pool.get().await?;
    let mut breaches = Vec::new();
    println!("capped keys' peaks (the database's own count after each claim):");
    for row in sql::query(&client, CAP_PEAKS, &[]).await? {
        let (kind, key): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let (peak, cap, at): (i64, i32, String) =
            (row.try_get(2)?, row.try_get(3)?, row.try_get(4)?);
        println!("  {kind} {key}: {peak} running at most, cap {cap}");
        if peak > i64::from(cap) {
            breaches.push(format!(
                "{kind} {key} had {peak} items running past its cap of {cap} at {at}"
            ));
        }
    }
    Ok(breaches)
}

fn report_fault(fault: String, recovered: Option<Duration>, what: &str) -> Fault {
    let seconds = recovered.map(|duration| duration.as_secs_f64());
    match seconds {
        Some(seconds) => println!("  {fault}: {what} after {seconds:.2} s"),
        None => println!("  {fault}: {what}: never"),
    }
    Fault { fault, recovered_s: seconds, recovered: what.to_owned() }
}

async fn job_outcomes(pool: &deadpool_postgres::Pool) -> Result<Vec<(String, i64)>, ChaosError> {
    let client = pool.get().await?;
    let rows = sql::query(&client, JOB_OUTCOMES, &[]).await?;
    rows.iter().map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).collect()
}

/// The exactly-once checks on what the workers saw, and the checks on every error answer.
fn check_record(record: &Record, refused: &[Refusal], faults_end: u64) -> Vec<String> {
    let mut failures = Vec::new();
    let mut held = HashSet::new();
    let twice =
        record.claims.iter().filter(|claim| !held.insert((claim.item, claim.attempt))).count();
    if twice > 0 {
        failures.push(format!("{twice} claim(s) handed out an (item, attempt) already held"));
    }
    let mut succeeded: HashMap<i64, HashSet<i32>> = HashMap::new();
    for accepted in &record.accepted {
        succeeded.entry(accepted.item).or_default().insert(accepted.attempt);
    }
    let doubled = succeeded.values().filter(|attempts| attempts.len() > 1).count();
    if doubled > 0 {
        failures.push(format!("{doubled} item(s) had successes of two attempts accepted"));
    }
    let count =
        |keep: &dyn Fn(&Refusal) -> bool| refused.iter().filter(|refusal| keep(refusal)).count();
    let server_errors = count(&|refusal| refusal.status >= 500 && refusal.status != 503);
    if server_errors > 0 {
        failures.push(format!(
            "{server_errors} answer(s) were 5xx other than 503, e.g. {}",
            first(refused, |refusal| refusal.status >= 500 && refusal.status != 503)
        ));
    }
    // A request sent before the faults ended may still be refused by them: only one sent
    // afterwards may not.
    let late = count(&|refusal| refusal.status == 503 && refusal.sent_ms > faults_end);
    if late > 0 {
        failures.push(format!("{late} request(s) sent after the faults ended got 503"));
    }
    let repeat_refused = count(&|refusal| refusal.repeat && refusal.status == 409);
    if repeat_refused > 0 {
        failures.push(format!(
            "{repeat_refused} repeated update(s) whose first sending had been applied got 409, e.g. {}",
            first(refused, |refusal| refusal.repeat && refusal.status == 409)
        ));
    }
    let other = count(&|refusal| {
        (400..500).contains(&refusal.status) && !(refusal.repeat && refusal.status == 409)
    });
    if other > 0 {
        failures.push(format!(
            "{other} other 4xx answer(s), e.g. {}",
            first(refused, |refusal| (400..500).contains(&refusal.status)
                && !(refusal.repeat && refusal.status == 409))
        ));
    }
    failures
}

fn first(refused: &[Refusal], keep: impl Fn(&Refusal) -> bool) -> String {
    refused
        .iter()
        .find(|refusal| keep(refusal))
        .map(|refusal| format!("{} {}: {}", refusal.op, refusal.status, refusal.message))
        .unwrap_or_default()
}

fn print_figures(figures: &Figures) {
    println!("chaos figures:");
    println!("  run                {:>8.1} s", figures.duration_s);
    println!("  jobs               {:>8}", figures.jobs);
    println!("  items              {:>8}", figures.items);
    println!("  claims             {:>8}", figures.claims);
    println!(
        "  re-attempts        {:>8}  (leases that expired or were released)",
        figures.reattempts
    );
    println!(
        "  dying workers      {:>8}  (items abandoned without a report)",
        figures.abandoned_by_dying_workers
    );
    println!(
        "  releases           {:>8}  (items handed back unworked)",
        figures.released_by_workers
    );
    println!(
        "  report repeats     {:>8}  ({} accepted)",
        figures.report_repeats, figures.repeats_accepted
    );
    println!(
        "  unanswered         {:>8}  (requests that got no answer)",
        figures.unanswered_requests
    );
    println!(
        "  503s               {:>8}  ({} after the faults ended)",
        figures.status_503, figures.status_503_after_faults
    );
    println!("  other errors       {:>8}", figures.other_errors);
    for fault in &figures.faults {
        match fault.recovered_s {
            Some(seconds) => {
                println!("  {:<34} {:>6.2} s  {}", fault.fault, seconds, fault.recovered)
            }
            None => println!("  {:<34}  never    {}", fault.fault, fault.recovered),
        }
    }
    let failover = &figures.failover;
    println!("  failover (primary kill -9, synchronous standby promoted):");
    println!("    standby promoted          {:>6.2} s after the kill", failover.promoted_s);
    match failover.first_claim_s {
        Some(seconds) => {
            println!("    first claim on it         {seconds:>6.2} s after the kill")
        }
        None => println!("    first claim on it          never"),
    }
    println!("    every broker ready        {:>6.2} s after the kill", failover.all_ready_s);
    println!("    503s since the kill       {:>6}", failover.status_503);
}

/// Starts a `fairway worker` whose command outlives the lease, waits until its command runs,
/// and kills the worker with SIGKILL. Returns how long its leases took to be released.
async fn kill_worker_mid_command(
    url: String,
    client: Client,
    out: PathBuf,
) -> Result<Duration, ChaosError> {
    const QUERIER: &str = "chaos-doomed";
    let log = log_file(&out.join("doomed-worker.log"))?;
    let mut worker = Command::new(std::env::current_exe()?)
        .args(["worker", "--url", &url, "--service", SERVICES[0], "--querier", QUERIER])
        .args(["--concurrency", "2", "--wait", "2s", "--heartbeat", "2s"])
        .args(["--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    let pid = worker.id().unwrap_or(0);
    let started = Instant::now();
    let commands = loop {
        let commands = child_processes(pid);
        if !commands.is_empty() {
            break commands;
        }
        if started.elapsed() > READY_LIMIT {
            return Err(ChaosError::Setup("the doomed worker never ran its command".to_owned()));
        }
        tokio::time::sleep(POLL).await;
    };
    worker.start_kill()?;
    worker.wait().await?;
    let killed = Instant::now();
    // Its commands outlive it; they are not the point.
    for command in commands {
        signal(Some(command), nix::sys::signal::Signal::SIGKILL);
    }
    loop {
        let queriers = client.queriers().await;
        let held = match queriers {
            Ok(queriers) => {
                queriers.iter().filter(|q| q.querier == QUERIER).map(|q| q.leases).sum()
            }
            Err(_) => 1,
        };
        if held == 0 {
            return Ok(killed.elapsed());
        }
        if killed.elapsed() > READY_LIMIT * 2 {
            return Err(ChaosError::Setup(
                "the killed worker's leases were never released".to_owned(),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The processes `pid`'s threads started.
fn child_processes(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| {
            children.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<u32>>()
        })
        .collect()
}

/// Long polls on a service no worker serves, whose client closes them early; then work for
/// them arrives. Returns how long until every one of those items could be claimed again, and
/// completes them.
async fn vanishing_long_polls(load: &Arc<Load>) -> Result<Duration, String> {
    let polls: Vec<_> = (0..VANISHING_POLLS)
        .map(|poll| {
            let client = load.clients[poll % load.clients.len()].clone();
            tokio::spawn(async move {
                let params = ClaimParams {
                    service: IDLE_SERVICE,
                    querier: "chaos-vanishing",
                    worker: poll as u32,
                    max: 1,
                    wait: Duration::from_secs(30),
                };
                // Dropping the request at the timeout closes its connection.
                tokio::time::timeout(VANISH_AFTER, client.claim(&params)).await
            })
        })
        .collect();
    for poll in polls {
        if let Ok(Ok(Ok(items))) = poll.await {
            if !items.is_empty() {
                return Err("a long poll on the idle service was answered with work".to_owned());
            }
        }
    }
    let (job, steps) = load::idle_job(VANISHING_POLLS);
    if load.submit(&job, steps).await.is_none() {
        return Err("the idle job could not be submitted".to_owned());
    }
    let submitted = Instant::now();
    let finisher = &load.clients[0];
    let params = ClaimParams {
        service: IDLE_SERVICE,
        querier: "chaos-finisher",
        worker: 0,
        max: VANISHING_POLLS as u32,
        wait: Duration::from_secs(1),
    };
    // Each item is completed as soon as it is claimed, so that none waits out a lease here.
    let mut claimed = HashSet::new();
    while claimed.len() < VANISHING_POLLS && submitted.elapsed() < READY_LIMIT {
        let items = match finisher.claim(&params).await {
            Ok(items) => items,
            Err(_) => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        for item in items {
            let report =
                Report::Successful { attempt: item.attempt, results: vec![], component: None };
            if let Err(error) = finisher.report(item.id.0, &report).await {
                return Err(format!("completing an idle item failed: {error}"));
            }
            claimed.insert(item.id.0);
        }
    }
    let ready_again = submitted.elapsed();
    if claimed.len() < VANISHING_POLLS {
        return Err(format!(
            "only {} of the vanished long polls' items were claimable again after {} s",
            claimed.len(),
            READY_LIMIT.as_secs()
        ));
    }
    Ok(ready_again)
}

/// Clients that close their long polls at random moments while work flows on a busy service,
/// some while the broker's claim for them is in its transaction. Returns how many leases
/// they left behind and how long those took to be released, and what they claimed and
/// reported, for the exactly-once checks.
async fn hasty_clients(load: &Arc<Load>) -> ((i64, Duration), Record) {
    const QUERIER: &str = "chaos-hasty";
    let record = Arc::new(std::sync::Mutex::new(Record::default()));
    let until = Instant::now() + HASTY_FOR;
    let clients: Vec<_> = (0..HASTY_CLIENTS)
        .map(|slot| {
            let client = load.clients[slot % load.clients.len()].clone();
            let record = record.clone();
            tokio::spawn(async move {
                let mut dice = Dice::new(slot as u64);
                let params = ClaimParams {
                    service: SERVICES[0],
                    querier: QUERIER,
                    worker: slot as u32,
                    max: 1,
                    wait: Duration::from_secs(5),
                };
                while Instant::now() < until {
                    let patience = Duration::from_millis(1 + dice.below(HASTY_MS));
                    let Ok(Ok(items)) = tokio::time::timeout(patience, client.claim(&params)).await
                    else {
                        continue;
                    };
                    // An answer that arrived in time is a live client's: it works the item.
                    for item in items {
                        let (id, attempt) = (item.id.0, item.attempt);
                        let report = Report::Successful {
                            attempt,
                            results: vec![serde_json::json!(format!("r{id}"))],
                            component: None,
                        };
                        let sent = now_ms();
                        let answer = client.report(id, &report).await;
                        if let Ok(mut record) = record.lock() {
                            record.claims.push(drive::Claim { item: id, attempt, at_ms: now_ms() });
                            match answer {
                                Ok(_) => record.accepted.push(drive::Accepted {
                                    item: id,
                                    attempt,
                                    repeat: false,
                                    at_ms: now_ms(),
                                }),
                                Err(error) => {
                                    record.refused.push(Refusal::of("report", &error, false, sent))
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for client in clients {
        let _ = client.await;
    }
    let ended = Instant::now();
    let record = record.lock().map(|mut record| std::mem::take(&mut *record)).unwrap_or_default();
    let mut orphaned = None;
    loop {
        let held = match load.clients[0].queriers().await {
            Ok(queriers) => {
                queriers.iter().filter(|q| q.querier == QUERIER).map(|q| q.leases).sum()
            }
            Err(_) => -1,
        };
        if orphaned.is_none() && held >= 0 {
            orphaned = Some(held);
        }
        if held == 0 {
            break;
        }
        if ended.elapsed() > READY_LIMIT * 2 {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    ((orphaned.unwrap_or(0), ended.elapsed()), record)
}

#[cfg(test)]
mod tests {
    use super::drive::{Accepted, Claim};
    use super::*;

    fn refusal(status: u16, repeat: bool, at_ms: u64) -> Refusal {
        let sent_ms = at_ms;
        Refusal { op: "report".to_owned(), status, repeat, at_ms, sent_ms, message: String::new() }
    }

    /// A record of claims of (item, attempt) and accepted successes of (item, attempt, repeat).
    fn record(claims: &[(i64, i32)], accepted: &[(i64, i32, bool)]) -> Record {
        Record {
            claims: claims
                .iter()
                .map(|&(item, attempt)| Claim { item, attempt, at_ms: 0 })
                .collect(),
            accepted: accepted
                .iter()
                .map(|&(item, attempt, repeat)| Accepted { item, attempt, repeat, at_ms: 0 })
                .collect(),
            ..Record::default()
        }
    }

    #[test]
    fn a_clean_record_passes() {
        let record = record(&[(1, 1), (1, 2)], &[(1, 2, false), (1, 2, true)]);
        let refused = [refusal(503, false, 10), refusal(0, true, 20), refusal(409, false, 30)];
        let failures = check_record(&record, &refused[..2], 15);
        assert!(failures.is_empty(), "{failures:?}");
        // A first sending refused as stale is a fault of the client's, not the broker's, but
        // the suite's clients never send one.
        assert_eq!(check_record(&record, &refused, 15).len(), 1);
    }

    #[test]
    fn a_request_caught_in_the_last_fault_is_excused_but_not_one_sent_after_it() {
        let record = record(&[(1, 1)], &[(1, 1, false)]);
        let caught = Refusal { sent_ms: 5, ..refusal(503, false, 20) };
        assert!(check_record(&record, &[caught], 10).is_empty());
        let late = check_record(&record, &[refusal(503, false, 20)], 10);
        assert_eq!(late.len(), 1, "{late:?}");
    }

    #[test]
    fn every_broken_promise_is_named() {
        let record = record(&[(1, 1), (1, 1)], &[(2, 1, false), (2, 2, false)]);
        let refused = [refusal(500, false, 1), refusal(503, false, 20), refusal(409, true, 2)];
        let failures = check_record(&record, &refused, 10);
        assert_eq!(failures.len(), 5, "{failures:?}");
        for expected in [
            "already held",
            "two attempts",
            "5xx other than 503",
            "after the faults ended",
            "got 409",
        ] {
            assert!(
                failures.iter().any(|failure| failure.contains(expected)),
                "{expected}: {failures:?}"
            );
        }
    }
}
