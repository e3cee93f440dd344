//! `fairway bench`: seeds a database, runs the broker's claim path beside baseline claim paths
//! on the same data, and reports throughput, latency and fairness. See docs/benchmarks.md.

pub mod args;
mod paths;
mod report;
mod seed;
mod sql;
mod stats;
mod wakeup;

use crate::report::Writes;
use crate::sql::{BASELINE_INDEXES, LOCK_WAITERS, WAL_WRITES};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::args::{BenchArgs, BenchPath};
use fairway_api::model::ServiceName;
use fairway_api::strategy::Strategy;
use fairway_broker::batch::Batches;
use fairway_broker::db::{self, DbError};
use fairway_broker::{BrokerError, WorkSignals};
use fairway_devdb::DevDbError;
use fairway_devdb::EmbeddedError;
use fairway_pg::Database;
use fairway_server::config::{AuthArgs, PoolArgs, ServeArgs};
use fairway_server::startup::{self, Application, StartupError};
use paths::{FifoStatements, Runner};
use report::{Contention, Machine, Report, Run};

const DATABASE: &str = "fairway_bench";

#[derive(Debug, Error)]
pub enum BenchError {
    #[error(transparent)]
    Embedded(Box<EmbeddedError>),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    DevDb(#[from] DevDbError),
    #[error(transparent)]
    Invalid(#[from] fairway_api::Invalid),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    #[error("writing results: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Unexpected(String),
    #[error("{0} claims or completions failed; the results are written, but do not trust them")]
    RunsFailed(u64),
}

impl From<EmbeddedError> for BenchError {
    fn from(error: EmbeddedError) -> Self {
        Self::Embedded(Box::new(error))
    }
}

pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let args = args.effective();
    let (admin, private_server) =
        fairway_devdb::connect_or_start(&args.database, "postgres").await?;
    let outcome = run_matrix(&args, &admin).await;
    if let Some(server) = private_server {
        server.stop().await?;
    }
    let report = outcome?;
    report.write(&args.json)?;
    println!("\n{}", report.markdown());
    println!("results written to {} (chart and table beside it)", args.json.display());
    // A claim path that errors measures nothing: fail the run, so that CI notices.
    let errors: u64 = report.runs.iter().map(|run| run.errors).sum();
    if errors > 0 {
        return Err(BenchError::RunsFailed(errors));
    }
    Ok(())
}

async fn run_matrix(args: &BenchArgs, admin_config: &Database) -> Result<Report, BenchError> {
    let mut runs = Vec::new();
    let mut postgres = String::new();
    let partitions = seed::Partitions {
        jobs_per_user: args.jobs_per_user as usize,
        tenants: args.tenants as usize,
        components: args.components as usize,
        services: 1,
        claim_every_service: false,
        shared_percent: 100,
        metadata: args.paths.iter().any(|path| path.strategy().is_some()),
        policies: false,
    };
    // The wide claims run at their points beside the others, on the same seed.
    let wide: Vec<BenchPath> = [
        BenchPath::Fair,
        BenchPath::Fifo,
        BenchPath::FifoBatched,
        BenchPath::FifoCounted,
        BenchPath::FifoUserCounted,
    ]
    .into_iter()
    .filter(|path| args.wide_max > 1 && args.paths.contains(path))
    .collect();
    let matrix = args.matrix();
    let mut points = matrix.clone();
    if !wide.is_empty() {
        points.extend(args.wide_points.iter().filter(|point| !matrix.contains(point)));
    }
    for (users, backlog) in points {
        let point = Point { users: users as usize, backlog: backlog as usize, partitions };
        let mut legs: Vec<Leg> = Vec::new();
        if args.wide_points.contains(&(users, backlog)) {
            legs.extend(wide.iter().map(|&path| (path, usize::from(args.wide_max))));
        }
        if matrix.contains(&(users, backlog)) {
            legs.extend(args.paths.iter().map(|&path| (path, usize::from(args.max))));
        }
        runs.extend(run_point(args, admin_config, point, &legs, &mut postgres).await?);
    }
    if args.paths.contains(&BenchPath::Fair) {
        for (name, users, partitions) in fair_beside_the_matrix(args, partitions) {
            let point = Point { users, backlog: COMPETING_TENANTS_BACKLOG, partitions };
            let legs = [(BenchPath::Fair, usize::from(args.max))];
            for mut run in run_point(args, admin_config, point, &legs, &mut postgres).await? {
                run.path.clone_from(&name);
                runs.push(run);
            }
        }
    }
    if args.wakeup_trials > 0 {
        runs.extend(run_wakeups(args, admin_config).await?);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    Ok(Report { command, machine: machine(postgres), runs })
}

/// The runs of `fair` alone beside the matrix, at 10,000 items, as (path, users, partitions):
/// competing tenants, work in several services, one service's lane then two services' lanes,
/// and users without then with policies (the same seed back to back), each as its flag asks.
fn fair_beside_the_matrix(
    args: &BenchArgs,
    partitions: seed::Partitions,
) -> Vec<(String, usize, seed::Partitions)> {
    let mut runs = Vec::new();
    if args.competing_tenants > 1 {
        let tenants = args.competing_tenants as usize;
        let competing = seed::Partitions { tenants, ..partitions };
        runs.push((COMPETING_TENANTS_PATH.to_owned(), COMPETING_TENANTS_USERS, competing));
    }
    if args.services_per_user > 1 {
        let services = args.services_per_user as usize;
        for (claim_every_service, jobs_per_user, name) in [
            (false, partitions.jobs_per_user, SERVICES_PER_USER_PATH),
            (true, services, EVERY_SERVICE_PATH),
        ] {
            let several =
                seed::Partitions { services, claim_every_service, jobs_per_user, ..partitions };
            runs.push((name.to_owned(), COMPETING_TENANTS_USERS, several));
        }
    }
    if !args.lane_shares.is_empty() {
        let one = seed::Partitions { jobs_per_user: 2, ..partitions };
        runs.push((ONE_LANE_PATH.to_owned(), COMPETING_TENANTS_USERS, one));
        for &shared_percent in &args.lane_shares {
            let two =
                seed::Partitions { services: 2, claim_every_service: true, shared_percent, ..one };
            runs.push((format!("{TWO_LANES_PATH}_{shared_percent}"), COMPETING_TENANTS_USERS, two));
        }
    }
    if args.policy_users > 0 {
        for (policies, name) in [(false, NO_POLICIES_PATH), (true, POLICIES_PATH)] {
            let policed = seed::Partitions { policies, ..partitions };
            runs.push((name.to_owned(), args.policy_users as usize, policed));
        }
    }
    runs
}

/// Where the competing-tenants and many-services runs are measured (see --competing-tenants
/// and --services-per-user), and their paths' names.
const COMPETING_TENANTS_USERS: usize = 1_000;
const COMPETING_TENANTS_BACKLOG: usize = 10_000;
pub const COMPETING_TENANTS_PATH: &str = "fair_tenants";
pub const SERVICES_PER_USER_PATH: &str = "fair_services";
/// The lanes runs (see --lane-shares): one service, and two with a percentage of shared users.
pub const ONE_LANE_PATH: &str = "fair_one_lane";
pub const TWO_LANES_PATH: &str = "fair_two_lanes";
pub const EVERY_SERVICE_PATH: &str = "fair_every_service";
/// `fair` where a third of the users are weighted 1 to 8, a tenth capped and a tenth
/// rate-limited, and the same point with no policy, run just before it (--policy-users).
pub const POLICIES_PATH: &str = "fair_policies";
pub const NO_POLICIES_PATH: &str = "fair_no_policies";

/// The wake-up measurements' paths: a worker's, and a producer's waiting for its job.
pub const WAKEUP_PATH: &str = "wakeup";
pub const JOB_WAKEUP_PATH: &str = "job_wakeup";

/// Whether a run is a wake-up measurement rather than a point of the claim matrix.
pub fn is_wakeup(path: &str) -> bool {
    path == WAKEUP_PATH || path == JOB_WAKEUP_PATH
}

/// One point of the measurements: what is seeded.
#[derive(Debug, Clone, Copy)]
struct Point {
    users: usize,
    backlog: usize,
    partitions: seed::Partitions,
}

/// A path to run, and how many items each of its claims asks for.
type Leg = (BenchPath, usize);

/// Seeds a fresh database for `point` and runs each of `legs` on it, the data reset between
/// them. Notes the server's version in `postgres`.
async fn run_point(
    args: &BenchArgs,
    admin_config: &Database,
    point: Point,
    legs: &[Leg],
    postgres: &mut String,
) -> Result<Vec<Run>, BenchError> {
    let Point { users, backlog, partitions } = point;
    let config = fresh_database(admin_config).await?;
    let pool = db::pool::connect(&config, pool_size(args))?;
    db::migrations::run(&pool).await?;
    *postgres = pool.get().await?.query_one("SHOW server_version", &[]).await?.try_get(0)?;
    eprintln!(
        "seeding {users} users with {} jobs each, over {} tenants, and {backlog} items",
        partitions.jobs_per_user, partitions.tenants
    );
    let seeded = Arc::new(seed::seed(&pool, users, backlog, partitions).await?);
    let mut runs = Vec::new();
    for (index, &(path, max)) in legs.iter().enumerate() {
        if index > 0 {
            seed::reset(&pool).await?;
        }
        let run = run_path(args, (path, max), &pool, &config, seeded.clone(), point).await?;
        eprintln!(
            "{:>22} max {max} {users:>6} users {backlog:>8} items: {:>8.0} claims/s  p99 {:>7.2} ms  jain {:.4} (best {:.4})  errors {}",
            run.path,
            run.claims_per_s.unwrap_or(0.0),
            run.p99_ms.unwrap_or(0.0),
            run.jain.unwrap_or(0.0),
            run.jain_bound.unwrap_or(0.0),
            run.errors
        );
        runs.push(run);
    }
    pool.close();
    Ok(runs)
}

/// Drops and recreates the benchmark database; returns its connection config.
async fn fresh_database(admin: &Database) -> Result<Database, BenchError> {
    Ok(fairway_devdb::recreate_database(admin, DATABASE).await?)
}

/// Every path gets the same pool: --pool-size, 32 by default like the workers.
fn pool_size(args: &BenchArgs) -> usize {
    args.pool.pool_size.max(1)
}

/// The admin token of the `http` paths' brokers under --http-auth.
const ADMIN_TOKEN: &str = "fw_bench-admin-0123456789abcdef0123456789abcdef";

fn serve_args(args: &BenchArgs) -> ServeArgs {
    let auth = AuthArgs {
        admin_token: args.http_auth.then(|| ADMIN_TOKEN.to_owned()),
        ..AuthArgs::default()
    };
    ServeArgs {
        pool: PoolArgs { pool_size: pool_size(args) },
        batches: args.batches,
        vacuum: args.vacuum,
        auth,
        ..ServeArgs::for_tests()
    }
}

async fn run_path(
    args: &BenchArgs,
    (path, max): Leg,
    pool: &deadpool_postgres::Pool,
    config: &Database,
    seeded: Arc<seed::Seeded>,
    point: Point,
) -> Result<Run, BenchError> {
    let Point { users, backlog, partitions } = point;
    // The baselines run with their own indexes; the broker's paths without them.
    let baseline = matches!(
        path,
        BenchPath::Fifo
            | BenchPath::FifoBatched
            | BenchPath::FifoCounted
            | BenchPath::FifoUserCounted
            | BenchPath::HarmonyLeastRunning
            | BenchPath::HarmonyRoundRobin
    );
    if baseline {
        let client = pool.get().await?;
        client.batch_execute(BASELINE_INDEXES).await?;
        client.batch_execute("ANALYZE work_items").await?;
    }
    let mut servers = Vec::new();
    let mut upkeep = None;
    let runner = match path {
        BenchPath::Fair
        | BenchPath::Oldest
        | BenchPath::Random
        | BenchPath::Priority
        | BenchPath::SelectOnlyOldest
        | BenchPath::SelectOnlyFair
        | BenchPath::PreferDistinctRandom
        | BenchPath::MaxSimultaneousOldest
        | BenchPath::OrElseSelectOnlyRandom => {
            let broker = startup::broker(pool.clone(), &serve_args(args), WorkSignals::default())?;
            // With the upkeep `serve` runs beside it, as in production.
            upkeep = Some(startup::maintain(&broker, config, &serve_args(args), None));
            let strategy = match path.strategy() {
                Some(text) => Strategy::parse(text)?.to_claim_argument(),
                None => None,
            };
            let services = partitions
                .claimed_services()
                .iter()
                .map(|service| ServiceName::parse(service))
                .collect::<Result<_, _>>()?;
            Runner::Broker { broker, strategy, services }
        }
        BenchPath::Http | BenchPath::Http3Brokers => {
            let brokers = if path == BenchPath::Http { 1 } else { 3 };
            let mut bases = Vec::with_capacity(brokers);
            for _ in 0..brokers {
                let app = Application::build(&serve_args(args), config.clone()).await?;
                bases.push(format!("http://127.0.0.1:{}", app.port()));
                servers.push((app.handle(), tokio::spawn(app.run_until_stopped())));
            }
            let mut client = reqwest::Client::builder().pool_max_idle_per_host(args.workers);
            if args.http_auth {
                client = client.default_headers(worker_token_header(pool).await?);
            }
            Runner::Http { client: client.build()?, bases }
        }
        other => match FifoStatements::of(other) {
            Some(statements) => {
                let most = args.batches.batch_max.into();
                // Their statements planned once per connection, as plpgsql keeps the plans of
                // the broker's claim and endings: planned afresh per batch, they would pay for
                // planning that `fair` does not.
                let mut planned_once = config.clone();
                let options = planned_once.config().get_options().unwrap_or_default().to_owned();
                planned_once
                    .config_mut()
                    .options(format!("{options} -c plan_cache_mode=force_generic_plan"));
                Runner::FifoBatched {
                    pool: db::pool::connect(&planned_once, pool_size(args))?,
                    statements,
                    // One claim lane, as the broker has for each service.
                    claims: Batches::new(1, most),
                    completions: Batches::new(args.batches.ending_lanes.into(), most),
                }
            }
            None => Runner::Sql { pool: pool.clone(), path: other },
        },
    };
    // Half the backlog at most: every user keeps work for the whole run, as in steady state.
    let limits = paths::Limits {
        duration: args.duration,
        max_duration: args.max_duration.max(args.duration),
        wanted: args.rounds.saturating_mul(users as u64),
        cap: (backlog / 2) as u64,
    };
    let runner = Arc::new(runner);
    let deferrals_before = runner.ending_deferrals();
    let lock_waits = LockWaits::sample(config).await?;
    let wal_before = wal_position(pool).await?;
    let mut measured =
        paths::measure(runner.clone(), seeded.clone(), args.workers, limits, max).await;
    // The first pass only: a reset between passes writes WAL of its own.
    let wal_bytes_per_claim = (measured.claims > 0)
        .then_some(wal_since(pool, &wal_before).await? / measured.claims as f64);
    let writes = writes_per_claim(pool, &wal_before, measured.claims).await?;
    let mut waiting = still_waiting(&measured.per_user, &seeded.items);
    // A small backlog is half handed out in a couple of seconds, too short a run to measure on
    // a shared machine: the path goes over it again, from the seeded state each time, until it
    // has run for `duration` in all. A pass that hands out nothing (a backlog too small to have
    // a half) ends it: passes would otherwise repeat without measuring anything.
    let mut pass_claims = measured.claims;
    while pass_claims > 0 && pass_claims >= limits.cap && measured.elapsed < args.duration {
        seed::reset(pool).await?;
        let pass = paths::measure(runner.clone(), seeded.clone(), args.workers, limits, max).await;
        pass_claims = pass.claims;
        for (waits, still) in waiting.iter_mut().zip(still_waiting(&pass.per_user, &seeded.items)) {
            *waits &= still;
        }
        measured.absorb(pass);
    }
    let row_lock_wait_ms = lock_waits.stop().await?;
    let per_thousand = |count: f64| count * 1000.0 / measured.claims.max(1) as f64;
    let contention = Contention {
        deferrals: runner
            .ending_deferrals()
            .zip(deferrals_before)
            .map(|(after, before)| per_thousand(after.saturating_sub(before) as f64)),
        row_lock_wait_ms: per_thousand(row_lock_wait_ms),
    };
    for (handle, task) in servers {
        handle.stop(true).await;
        let _ = task.await;
    }
    if let Some(upkeep) = upkeep {
        upkeep.stop().await;
    }
    if baseline {
        let client = pool.get().await?;
        client.batch_execute("DROP INDEX bench_fifo_ready, bench_harmony_ready").await?;
    }
    if let Some(error) = &measured.first_error {
        eprintln!("{path:?}: {} errors, the first: {error}", measured.errors);
    }
    let mut latencies = measured.latencies;
    latencies.sort_unstable();
    let millis = |q| stats::percentile(&latencies, q).map(|micros| micros / 1000.0);
    let seconds = measured.elapsed.as_secs_f64();
    // Over the users who stayed backlogged and whose share their weight decides: each one's
    // items divided by its weight (all 1 but where the seed has policies).
    let served_waiting: Vec<f64> = measured
        .per_user
        .iter()
        .zip(&waiting)
        .zip(seeded.weights.iter().zip(&seeded.held))
        .filter(|((_, waits), (_, held))| **waits && !**held)
        .map(|((served, _), (weight, _))| *served as f64 / *weight as f64)
        .collect();
    let weighted = seeded.weights.iter().any(|weight| *weight > 1);
    Ok(Run {
        path: path_name(path),
        users,
        jobs: seeded.jobs.len(),
        tenants: partitions.tenants,
        components: partitions.components,
        backlog,
        workers: args.workers,
        max,
        duration_s: seconds,
        claims_per_s: Some(measured.claims as f64 / seconds),
        p50_ms: millis(0.5),
        p90_ms: millis(0.9),
        p99_ms: millis(0.99),
        jain: stats::jain(&served_waiting),
        // The bound counts whole items per user, which weighted shares are not.
        jain_bound: (!weighted)
            .then(|| {
                stats::best_jain(
                    served_waiting.iter().sum::<f64>() as u64,
                    served_waiting.len() as u64,
                )
            })
            .flatten(),
        errors: measured.errors,
        wal_bytes_per_claim,
        writes,
        contention: Some(contention),
    })
}

/// How often a run samples the backends waiting for rows: a run of seconds still takes hundreds
/// of samples, and each is a query the measured path competes with for CPU.
const LOCK_SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// Samples, on a connection of its own, how many backends wait for a row another transaction
/// holds (`lock_waiters.sql`), until stopped; each sample counts for the time since the one
/// before, so that a slow sample loses nothing.
pub struct LockWaits {
    stop: tokio::sync::oneshot::Sender<()>,
    sampler: tokio::task::JoinHandle<Result<f64, BenchError>>,
}

impl LockWaits {
    /// Starts sampling the database `config` names.
    pub async fn sample(config: &Database) -> Result<Self, BenchError> {
        let pool = db::pool::connect(config, 1)?;
        let client = pool.get().await?;
        let statement = client.prepare(LOCK_WAITERS).await?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let sampler = tokio::spawn(async move {
            // The pool goes with its one connection.
            let _pool = pool;
            let mut tick = tokio::time::interval(LOCK_SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut waited_ms = 0.0;
            let mut last = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok(waited_ms),
                    _ = tick.tick() => {
                        let waiting: i64 = client.query_one(&statement, &[]).await?.try_get(0)?;
                        waited_ms += waiting as f64 * last.elapsed().as_secs_f64() * 1000.0;
                        last = std::time::Instant::now();
                    }
                }
            }
        });
        Ok(Self { stop, sampler })
    }

    /// Stops sampling: the milliseconds backends waited for rows in all.
    pub async fn stop(self) -> Result<f64, BenchError> {
        let _ = self.stop.send(());
        self.sampler.await.map_err(|error| BenchError::Unexpected(error.to_string()))?
    }
}

/// What the WAL since `position` says was written, per claim: rows (inserted, updated,
/// deleted), of those the updates that were not HOT, and index entries. Read with
/// pg_walinspect, so exact whatever else loads the host; None where the extension is missing.
async fn writes_per_claim(
    pool: &deadpool_postgres::Pool,
    position: &str,
    claims: u64,
) -> Result<Option<Writes>, BenchError> {
    let client = pool.get().await?;
    if claims == 0
        || client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect").await.is_err()
    {
        return Ok(None);
    }
    let row = client.query_one(WAL_WRITES, &[&position]).await?;
    let per_claim = |column: usize| -> Result<f64, BenchError> {
        Ok(row.try_get::<_, f64>(column)? / claims as f64)
    };
    Ok(Some(Writes {
        rows: per_claim(0)?,
        cold_updates: per_claim(1)?,
        index_entries: per_claim(2)?,
    }))
}

/// Where the server's WAL is now.
async fn wal_position(pool: &deadpool_postgres::Pool) -> Result<String, BenchError> {
    let client = pool.get().await?;
    Ok(client.query_one("SELECT pg_current_wal_lsn()::text", &[]).await?.try_get(0)?)
}

/// The WAL written since `position`, in bytes: by the path's claims and completions, their
/// commits, and anything else the server did meanwhile (the broker's vacuum, the reaper).
async fn wal_since(pool: &deadpool_postgres::Pool, position: &str) -> Result<f64, BenchError> {
    let client = pool.get().await?;
    let sql = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8";
    Ok(client.query_one(sql, &[&position]).await?.try_get(0)?)
}

/// Which users had ready work for the whole of a pass: with no work added during a pass, those
/// that were not served everything they had.
fn still_waiting(served: &[u64], seeded: &[u64]) -> Vec<bool> {
    served.iter().zip(seeded).map(|(served, seeded)| served < seeded).collect()
}

fn path_name(path: BenchPath) -> String {
    serde_json::to_value(path).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// The wake-up paths, `wakeup` and `job_wakeup`, on one broker of their own.
async fn run_wakeups(args: &BenchArgs, admin: &Database) -> Result<Vec<Run>, BenchError> {
    let config = fresh_database(admin).await?;
    let app = Application::build(&serve_args(args), config).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let broker = app.broker().clone();
    let handle = app.handle();
    let task = tokio::spawn(app.run_until_stopped());
    let trials = args.wakeup_trials;
    let mut outcomes = Vec::new();
    let started = std::time::Instant::now();
    outcomes.push((WAKEUP_PATH, wakeup::measure(&broker, &base, trials).await, started.elapsed()));
    let started = std::time::Instant::now();
    let job_outcome = wakeup::measure_job(&broker, &base, trials).await;
    outcomes.push((JOB_WAKEUP_PATH, job_outcome, started.elapsed()));
    handle.stop(true).await;
    let _ = task.await;
    let mut runs = Vec::new();
    for (path, outcome, duration) in outcomes {
        let mut latencies = outcome?;
        latencies.sort_unstable();
        let millis = |q| stats::percentile(&latencies, q).map(|micros| micros / 1000.0);
        eprintln!(
            "{path} p50 {:.2} ms p99 {:.2} ms",
            millis(0.5).unwrap_or(0.0),
            millis(0.99).unwrap_or(0.0)
        );
        runs.push(Run {
            path: path.to_owned(),
            users: trials,
            jobs: trials,
            tenants: 1,
            components: 1,
            backlog: 0,
            workers: 1,
            max: 1,
            duration_s: duration.as_secs_f64(),
            claims_per_s: None,
            p50_ms: millis(0.5),
            p90_ms: millis(0.9),
            p99_ms: millis(0.99),
            jain: None,
            jain_bound: None,
            errors: 0,
            wal_bytes_per_claim: None,
            writes: None,
            contention: None,
        });
    }
    Ok(runs)
}

fn machine(postgres: String) -> Machine {
    let memory_gib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| {
        info.lines()
            .find(|line| line.starts_with("MemTotal:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map(|kib| (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0)
    });
    Machine {
        cores: std::thread::available_parallelism().map(usize::from).unwrap_or(1),
        memory_gib,
        postgres,
        os: std::env::consts::OS.to_owned(),
    }
}

/// `Authorization: Bearer` with a new worker token scoped to the bench's service, for
/// --http-auth.
async fn worker_token_header(
    pool: &deadpool_postgres::Pool,
) -> Result<reqwest::header::HeaderMap, BenchError> {
    let authenticator =
        fairway_broker::auth::Authenticator::start(pool.clone(), Duration::from_secs(5), None)
            .await?;
    let (_, token) = authenticator
        .create(fairway_broker::auth::NewToken {
            name: None,
            role: fairway_api::tokens::Role::Worker,
            tenants: None,
            services: Some(vec![seed::SERVICE.to_owned()]),
            expires_in: None,
        })
        .await?;
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|error| BenchError::Unexpected(error.to_string()))?;
    headers.insert(reqwest::header::AUTHORIZATION, value);
    Ok(headers)
}
