//! Command-line and environment configuration: every knob lives here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "fairway", version, about = "A fair-queueing work broker on PostgreSQL")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// How log lines are written to standard output: `text`, for people (coloured only on a
    /// terminal), or `json`, one object per line, for a cluster's log collector.
    #[arg(long, global = true, env = "FAIRWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the broker's HTTP server.
    Serve(ServeArgs),
    /// Start the private PostgreSQL server, run COMMAND with DATABASE_URL pointing at it, then
    /// stop the server (and, with --ephemeral, delete its data directory).
    Postgres(PostgresArgs),
    /// Measure claim throughput, latency and fairness of the broker beside baseline claim
    /// paths, on a freshly seeded database, and write the results.
    Bench(BenchArgs),
    /// Look into and steer a running broker over its HTTP API.
    Admin(AdminArgs),
    /// Submit a job to a running broker.
    Submit(SubmitArgs),
    /// Serve a service by running a command per work item: any executable becomes a worker.
    Worker(WorkerArgs),
    /// Show fair sharing on a running broker: three users arrive one after another while
    /// `fairway worker` pods serve them, and each user's share of the workers is drawn as SVG.
    Demo(DemoArgs),
    /// Test tooling: the fault suite (`make chaos`) or, with --soak, the steady-load soak run
    /// (`make soak`). See docs/reliability.md.
    #[command(hide = true)]
    Chaos(ChaosArgs),
    /// Test tooling: the fault suite's worker process, which `fairway chaos` starts.
    #[command(hide = true, name = "chaos-drive")]
    ChaosDrive(ChaosDriveArgs),
}

/// How the command-line tools reach a broker.
#[derive(Debug, Clone, Args)]
pub struct BrokerAddress {
    /// The broker's base URL.
    #[arg(long, env = "FAIRWAY_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,

    /// Bearer token sent with every request.
    #[arg(long, env = "FAIRWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Each service's queue: ready, running, paused, oldest ready, claims per second.
    Services,
    /// Rows of the fair order's user_work table: who has work where.
    Users {
        /// Only this service's rows.
        #[arg(long)]
        service: Option<String>,
        /// Only this user's rows.
        #[arg(long)]
        user: Option<String>,
        /// Most rows to list (1–10000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show or steer one job.
    Jobs {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Tenants: their limits, waiting items and shards.
    Tenants {
        #[command(subcommand)]
        command: Option<TenantCommand>,
    },
    /// Queriers: state, last request, leases held, tenants served.
    Queriers,
    /// Recount every counter from the work items; exits non-zero on any difference.
    Consistency,
    /// Bearer tokens: make, list and revoke them (needs an admin token).
    Tokens {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it, once, alone on the last line: it is stored only as a hash.
    Create {
        /// admin (everything), reader (every read), producer (jobs) or worker (work).
        #[arg(long, value_parser = ["admin", "reader", "producer", "worker"])]
        role: String,
        /// A producer token's tenant; give it once per tenant. None: every tenant.
        #[arg(long = "tenant", value_name = "TENANT")]
        tenants: Vec<String>,
        /// A worker token's service; give it once per service. None: every service.
        #[arg(long = "service", value_name = "SERVICE")]
        services: Vec<String>,
        /// What to call it [default: its role and a few hex digits of its hash].
        #[arg(long)]
        name: Option<String>,
        /// How long it lasts, such as `90d` or `12h` [default: until revoked].
        #[arg(long, value_parser = positive_duration)]
        expires: Option<Duration>,
    },
    /// Every token: name, role, scope, expiry, last use; never the secret.
    List,
    /// Revoke a token, by id or by the name of a live token.
    Revoke {
        /// The token's id, or its name.
        token: String,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum JobCommand {
    /// The job's status, progress and steps.
    Show { job_id: uuid::Uuid },
    /// Stop handing out the job's items; running ones finish.
    Pause { job_id: uuid::Uuid },
    /// Hand out a paused job's items again.
    Resume { job_id: uuid::Uuid },
    /// Cancel every unfinished item of the job.
    Cancel { job_id: uuid::Uuid },
}

#[derive(Debug, Clone, Subcommand)]
pub enum TenantCommand {
    /// One tenant.
    Show { tenant: String },
    /// Set a tenant's limits, creating it if needed.
    Set {
        tenant: String,
        /// Queriers that serve the tenant; 0: all of them.
        #[arg(long, default_value_t = 0)]
        max_queriers: u32,
        /// Most ready items the tenant may have waiting; 0: no limit.
        #[arg(long, default_value_t = 0)]
        max_outstanding: u32,
    },
}

#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// The job as the JSON body of `POST /jobs`; `-` reads it from standard input. The other
    /// flags build the job instead.
    #[arg(long, conflicts_with_all = ["user", "service", "item"])]
    pub file: Option<PathBuf>,

    /// The user the job belongs to.
    #[arg(long, required_unless_present = "file")]
    pub user: Option<String>,

    /// The job's tenant.
    #[arg(long, default_value = "default")]
    pub tenant: String,

    /// A service of the workflow, in order; give it once per step.
    #[arg(long, required_unless_present = "file")]
    pub service: Vec<String>,

    /// An item's payload, as JSON; give it once per item of the first step.
    #[arg(long = "item", value_name = "JSON", required_unless_present = "file")]
    pub item: Vec<String>,

    /// Synchronous: a person is waiting for it, so it goes before the user's async jobs.
    #[arg(long)]
    pub sync: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// How long the demo runs; the second user arrives after a third of it, the third after
    /// two thirds.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Worker pods started, each a `fairway worker` process.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub pods: u32,

    /// Items each pod works on at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub concurrency: u32,

    /// How long each item's command sleeps.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub item_time: Duration,

    /// Where to write the chart.
    #[arg(long, default_value = "docs/demo/shares.svg")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Data directory of the suite's own PostgreSQL cluster, kept between runs so that an
    /// immediate restart finds its data; each run starts from a fresh database in it.
    #[arg(long, default_value = "target/chaos-postgres")]
    pub data_dir: PathBuf,

    /// Directory holding the PostgreSQL server binaries [default: as for `serve`].
    #[arg(long, env = "FAIRWAY_PG_BIN")]
    pub pg_bin: Option<PathBuf>,

    /// Where the brokers' logs, the workers' record and the figures go.
    #[arg(long, default_value = "target/chaos")]
    pub out: PathBuf,

    /// Concurrent HTTP workers in the worker process.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,

    /// The brokers' --lease: how long an item held by a dead worker stays leased.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Run steady load without faults for --duration, sampling memory and table sizes.
    #[arg(long)]
    pub soak: bool,

    /// How long the soak runs.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct ChaosDriveArgs {
    /// The brokers' base URLs (comma-separated); workers are dealt over them and move to the
    /// next when one cannot be reached.
    #[arg(long, value_delimiter = ',', required = true)]
    pub url: Vec<String>,

    /// Concurrent workers.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,

    /// Where to write the record of every claim and answer, as JSON, once told to stop.
    #[arg(long)]
    pub record: PathBuf,

    /// Per mille of claimed items whose worker dies holding them (no report), until the
    /// process reads `calm` on its standard input.
    #[arg(long, default_value_t = 5)]
    pub die_per_mille: u64,

    /// Per mille of reports sent twice, the second time to another broker, as a worker does
    /// when the first answer is lost.
    #[arg(long, default_value_t = 30)]
    pub repeat_per_mille: u64,
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// The service whose items this worker does.
    #[arg(long, env = "FAIRWAY_WORKER_SERVICE")]
    pub service: String,

    /// The querier (pod) name this worker asks as; tenant shards are drawn over queriers.
    #[arg(long, env = "FAIRWAY_WORKER_QUERIER")]
    pub querier: String,

    /// Items worked on at once, each by its own run of COMMAND.
    #[arg(long, env = "FAIRWAY_WORKER_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,

    /// How long one work request waits for work to appear (at most 60 s).
    #[arg(long, env = "FAIRWAY_WORKER_WAIT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// How often a heartbeat extends the lease of an item whose command still runs.
    #[arg(long, env = "FAIRWAY_WORKER_HEARTBEAT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub heartbeat: Duration,

    /// The command run per item, with the item's JSON on standard input. Exit 0 with a JSON
    /// array on standard output: successful, those are the results. Otherwise: failed, with
    /// the end of standard error as the error.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the HTTP server listens on.
    #[arg(long, env = "FAIRWAY_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseArgs,

    /// How long a claimed work item stays leased to its worker without a heartbeat.
    #[arg(long, env = "FAIRWAY_LEASE", default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// How long a claim first leases its item, when shorter than --lease: the worker's first
    /// heartbeat or report extends it to --lease. An item whose worker never got the answer (or
    /// died at once) is then back within this plus --reap-interval; workers must heartbeat
    /// within it. 0s: off, a claim leases for --lease.
    #[arg(long, env = "FAIRWAY_FIRST_LEASE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub first_lease: Duration,

    /// Retries after a retryable failure before an item fails for good.
    #[arg(long, env = "FAIRWAY_MAX_RETRIES", default_value_t = 3)]
    pub max_retries: u32,

    /// How often the lease reaper looks for expired leases.
    #[arg(long, env = "FAIRWAY_REAP_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub reap_interval: Duration,

    /// How long a querier that makes no work request and holds no lease stays a member of
    /// tenant shards before it is forgotten.
    #[arg(long, env = "FAIRWAY_QUERIER_FORGET_DELAY", default_value = "1m", value_parser = humantime::parse_duration)]
    pub querier_forget_delay: Duration,

    /// How long the broker takes to stop on SIGTERM or SIGINT, at most. It answers 503 on
    /// /readyz and 204 to waiting long polls at once, starts no claim, lets the transactions in
    /// flight commit and answer, then exits; what is still running after this long is cut off.
    #[arg(long, env = "FAIRWAY_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[arg(long, env = "FAIRWAY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Longest the broker holds a long poll, whatever its `wait` asks (which may be up to 60 s).
    /// Lower it below the idle timeout of any proxy between workers and the broker.
    #[arg(long, env = "FAIRWAY_LONG_POLL_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    pub long_poll_max: Duration,

    #[command(flatten)]
    pub batches: BatchArgs,

    #[command(flatten)]
    pub vacuum: VacuumArgs,

    #[command(flatten)]
    pub prune: PruneArgs,

    #[command(flatten)]
    pub metrics: MetricsArgs,

    #[command(flatten)]
    pub auth: AuthArgs,
}

/// Who may use the broker (README, "Security").
#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// An admin token (at least 32 characters) whose hash the broker stores at start-up, unless
    /// it is there already; auth is then on. Make one with
    /// `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'`.
    #[arg(long, env = "FAIRWAY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Serve a non-loopback --bind with auth off (no FAIRWAY_ADMIN_TOKEN and no token in the
    /// database): anyone who reaches the port may do anything. Without it such a broker
    /// refuses to start; with it, it warns at every start.
    #[arg(long, env = "FAIRWAY_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,

    /// Answer /metrics only to an admin or reader token while auth is on (it is open by
    /// default, as /healthz and /readyz are).
    #[arg(long, env = "FAIRWAY_METRICS_REQUIRE_TOKEN")]
    pub metrics_require_token: bool,

    /// How long a broker trusts a token it looked up: a revoked token is refused by every
    /// broker within this, and auth turns on this long after the first token is made.
    #[arg(long, env = "FAIRWAY_AUTH_CACHE_TTL", default_value = "5s", value_parser = positive_duration)]
    pub auth_cache_ttl: Duration,
}

impl Default for AuthArgs {
    /// Auth off unless the database holds tokens; what the tests and the benchmark start with.
    fn default() -> Self {
        Self {
            admin_token: None,
            insecure_no_auth: false,
            metrics_require_token: false,
            auth_cache_ttl: Duration::from_secs(5),
        }
    }
}

/// What `GET /metrics` reports.
#[derive(Debug, Clone, Copy, Args)]
pub struct MetricsArgs {
    /// Most age of the queue gauges /metrics reads from the database (items per state, oldest
    /// ready item, active users). However often Prometheus scrapes and however many brokers
    /// there are, the database computes them at most once per this interval.
    #[arg(long, env = "FAIRWAY_METRICS_REFRESH", default_value = "5s", value_parser = humantime::parse_duration)]
    pub metrics_refresh: Duration,

    /// Label the per-queue metrics with the tenant too. Off by default: each tenant multiplies
    /// the series Prometheus stores.
    #[arg(long, env = "FAIRWAY_METRICS_TENANT_LABEL")]
    pub metrics_tenant_label: bool,
}

/// How long finished jobs are kept, and how often the broker deletes older ones.
#[derive(Debug, Clone, Copy, Args)]
pub struct PruneArgs {
    /// How long a finished job (successful, complete_with_errors, failed or canceled) is kept,
    /// with its items and results, after it finished; then the pruner deletes it and its id
    /// answers 404. 0s keeps every job for ever.
    #[arg(long, env = "FAIRWAY_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub retention: Duration,

    /// How often the pruner looks for jobs past --retention. Brokers sharing a database take
    /// turns: one prunes at a time.
    #[arg(long, env = "FAIRWAY_PRUNE_INTERVAL", default_value = "1m", value_parser = positive_duration)]
    pub prune_interval: Duration,
}

/// A duration greater than zero, such as `1m` or `500ms`.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be greater than zero".to_owned()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// How often the broker vacuums the fair order's tables itself.
#[derive(Debug, Clone, Copy, Args)]
pub struct VacuumArgs {
    /// How often the broker vacuums the small tables that hold the fair order. Every claim and
    /// completion rewrites their rows, and the dead index entries pile up at the head of the
    /// order, where each claim starts reading; autovacuum may come by only once a minute.
    /// 0s: leave them to autovacuum.
    #[arg(long, env = "FAIRWAY_VACUUM_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub vacuum_interval: Duration,
}

/// How the broker gathers concurrent claims, and concurrent reports that end attempts, into
/// shared transactions (group commit).
#[derive(Debug, Clone, Copy, Args)]
pub struct BatchArgs {
    /// How many claim transactions, and how many transactions ending attempts, run at once;
    /// requests that arrive meanwhile queue and go together in the next one. More claim lanes
    /// race each other for the head of the same fair order.
    #[arg(long, env = "FAIRWAY_BATCH_LANES", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_lanes: u16,

    /// Most requests one such transaction serves. Batches smaller than the number of workers
    /// let a claim transaction and an ending transaction run side by side, on different
    /// workers' requests.
    #[arg(long, env = "FAIRWAY_BATCH_MAX", default_value_t = 12,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_max: u16,
}

/// Where the broker's database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection string (URL or key=value form). Without it, fairway starts its own
    /// private PostgreSQL server from the system's binaries, with data in --data-dir.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub url: Option<String>,

    /// Data directory of the private PostgreSQL server used when no database URL is given
    /// [default: $XDG_DATA_HOME/fairway/postgres, or /var/lib/fairway/postgres as root].
    #[arg(long, env = "FAIRWAY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Directory holding the PostgreSQL server binaries (initdb, postgres, pg_ctl)
    /// [default: the newest /usr/lib/postgresql/*/bin, else the PATH].
    #[arg(long, env = "FAIRWAY_PG_BIN")]
    pub pg_bin: Option<PathBuf>,

    /// Never start a private PostgreSQL server: without a database URL, refuse to start. The
    /// container image sets it, since a cluster's broker must use the cluster's database.
    #[arg(long, env = "FAIRWAY_NO_EMBEDDED_POSTGRES")]
    pub no_embedded_postgres: bool,

    /// Connections in the broker's database pool.
    #[arg(long, env = "FAIRWAY_DB_POOL_SIZE", default_value_t = 32)]
    pub pool_size: usize,
}

#[derive(Debug, Clone, Args)]
pub struct PostgresArgs {
    /// Data directory of the private server (created with initdb when missing).
    #[arg(long, env = "FAIRWAY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Directory holding the PostgreSQL server binaries [default: as for `serve`].
    #[arg(long, env = "FAIRWAY_PG_BIN")]
    pub pg_bin: Option<PathBuf>,

    /// Delete the data directory after the command ends.
    #[arg(long)]
    pub ephemeral: bool,

    /// Database the command's DATABASE_URL names (created when missing).
    #[arg(long, default_value = "fairway")]
    pub database: String,

    /// The command to run, with its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The claim paths the benchmark can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BenchPath {
    /// The broker's own claim, called in-process as the HTTP handler calls it.
    Fair,
    /// A plain FIFO SKIP LOCKED claim on the same table, one transaction per claim and per
    /// completion: no fairness, the naive reference.
    Fifo,
    /// The same FIFO claim behind the broker's group commit: the claims gathered in one
    /// transaction are served by one statement, and so are the completions. No fairness, and
    /// built as the broker is: the honest ceiling.
    FifoBatched,
    /// `fifo_batched` that also keeps the counters the fair order reads (user_work, users,
    /// service_users), each row moved once per batch: what keeping those counters costs a
    /// claim whose choice is free, a ceiling for the fair claim built on them. Not run unless
    /// named in --paths.
    FifoCounted,
    /// `fifo_batched` that keeps only the users' queue rows (service_users) the fair order's
    /// index reads, each row once per batch: the least any claim that keeps an exact
    /// least-work-in-progress order of users pays. Not run unless named in --paths.
    FifoUserCounted,
    /// Harmony's documented algorithm: a GROUP BY over user_work per claim.
    HarmonyLeastRunning,
    /// Harmony's production query: a ROW_NUMBER() round robin over user_work per claim.
    HarmonyRoundRobin,
    /// The full loop over HTTP against a running broker.
    Http,
    /// The full loop over HTTP against three brokers on the one database (each with its own
    /// pool, batches and server, in this process), the workers dealt over them: how far more
    /// brokers take one primary.
    #[serde(rename = "http_3_brokers")]
    #[value(name = "http_3_brokers")]
    Http3Brokers,
    /// The broker's claim under `strategy=oldest`, over jobs with metadata (as are all the
    /// strategy paths below, whose seed gives job j `customer` = j mod 1,000, `mode` a or b
    /// by j's parity and a priority from 0 to 999 hashed from j).
    Oldest,
    /// `strategy=random`.
    Random,
    /// `strategy=priority`.
    Priority,
    /// `select_only(mode = a, oldest)`.
    SelectOnlyOldest,
    /// `select_only(mode = a, fair)`: the fair order cannot be filtered, so this reads the
    /// matching steps in submission order (README, "Claim strategies").
    SelectOnlyFair,
    /// `prefer_distinct(customer, 2, random)`.
    PreferDistinctRandom,
    /// `max_simultaneous(customer, 2, oldest)`.
    MaxSimultaneousOldest,
    /// `or_else(select_only(mode = a, random), random)`.
    OrElseSelectOnlyRandom,
}

impl BenchPath {
    /// The strategy a broker path claims under, as a worker would send it; None for the fair
    /// order and the baselines.
    pub fn strategy(self) -> Option<&'static str> {
        Some(match self {
            Self::Fair
            | Self::Fifo
            | Self::FifoBatched
            | Self::FifoCounted
            | Self::FifoUserCounted
            | Self::HarmonyLeastRunning
            | Self::HarmonyRoundRobin
            | Self::Http
            | Self::Http3Brokers => return None,
            Self::Oldest => "oldest",
            Self::Random => "random",
            Self::Priority => "priority",
            Self::SelectOnlyOldest => {
                r#"{"select_only": {"key": "mode", "value": "a", "then": "oldest"}}"#
            }
            Self::SelectOnlyFair => {
                r#"{"select_only": {"key": "mode", "value": "a", "then": "fair"}}"#
            }
            Self::PreferDistinctRandom => {
                r#"{"prefer_distinct": {"key": "customer", "max": 2, "then": "random"}}"#
            }
            Self::MaxSimultaneousOldest => {
                r#"{"max_simultaneous": {"key": "customer", "max": 2, "then": "oldest"}}"#
            }
            Self::OrElseSelectOnlyRandom => {
                r#"{"or_else": [{"select_only": {"key": "mode", "value": "a", "then": "random"}},
                                "random"]}"#
            }
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub batches: BatchArgs,

    #[command(flatten)]
    pub vacuum: VacuumArgs,

    /// Numbers of users to measure at (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub users: Vec<u32>,

    /// Ready backlogs to measure at (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10000,1000000")]
    pub backlog: Vec<u32>,

    /// The points to measure at, as USERSxITEMS (comma-separated), in place of every pair of
    /// --users and --backlog.
    #[arg(long, value_delimiter = ',', value_parser = parse_bench_point)]
    pub points: Vec<(u32, u32)>,

    /// Tenants the users are dealt over (user i belongs to tenant i mod N); 1: all in `default`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub tenants: u32,

    /// Query components the jobs are dealt over (job i's items need component i mod N); 1: all
    /// `unknown`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub components: u32,

    /// Jobs per user: J = users × this, job i belonging to user i mod users, the backlog split
    /// evenly over the jobs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs_per_user: u32,

    /// Concurrent claimers, each with its own connection while it works.
    #[arg(long, default_value_t = 32)]
    pub workers: usize,

    /// How long each path runs at least, at each point of the matrix.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Runs go on past --duration until every user could have been served this many items, so
    /// that per-user counts are large enough for Jain's index to mean something...
    #[arg(long, default_value_t = 10)]
    pub rounds: u64,

    /// ...but no longer than this. A pass over the backlog also ends once half of it is handed
    /// out, so that no user runs dry; a path that gets there before --duration goes over the
    /// backlog again, from the seeded state, until it has run --duration in all.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub max_duration: Duration,

    /// Items per claim.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub max: u16,

    /// Items per claim of the wide claims: at each of --wide-points, `fair` and the FIFO paths
    /// (those of --paths) run again with this --max. 1: none.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub wide_max: u16,

    /// Where the wide claims run, as USERSxITEMS (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = parse_bench_point,
          default_value = "10x1000000,10000x1000000")]
    pub wide_points: Vec<(u32, u32)>,

    /// Beside the matrix, `fair` once more at 1,000 users × 10,000 items dealt over this many
    /// tenants competing for the one component, reported as path `fair_tenants` (0 or 1: not
    /// run). It checks the tenant level of the fair order, which the matrix's one tenant skips.
    #[arg(long, default_value_t = 10)]
    pub competing_tenants: u32,

    /// Run the `http` paths with auth on: the brokers get an admin token, and the workers claim
    /// and report with a worker token (scoped to the bench's service), as in production. Off:
    /// no token, as a broker on loopback without tokens serves.
    #[arg(long)]
    pub http_auth: bool,

    /// Claim paths to run (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fair,fifo,fifo_batched,harmony_least_running,harmony_round_robin,http"
    )]
    pub paths: Vec<BenchPath>,

    /// Trials of each wake-up measurement, a worker's (`wakeup`) and a producer's waiting for
    /// its job (`job_wakeup`); 0 to skip both.
    #[arg(long, default_value_t = 200)]
    pub wakeup_trials: usize,

    /// A two-minute smoke run: 10 and 1,000 users, 10,000 items, 2 s per path, the wide claims
    /// at 10 users only, 50 wake-ups of each kind.
    #[arg(long)]
    pub quick: bool,

    /// Where to write the results as JSON; the chart (chart.svg) and the table (results.md) go in
    /// the same directory.
    #[arg(long, value_name = "FILE", default_value = "docs/bench/results.json")]
    pub json: PathBuf,
}

impl BenchArgs {
    /// Applies --quick on top of the other settings.
    pub fn effective(mut self) -> Self {
        if self.quick {
            self.users = vec![10, 1000];
            self.backlog = vec![10_000];
            self.points.clear();
            self.wide_points = vec![(10, 10_000)];
            self.duration = Duration::from_secs(2);
            self.max_duration = Duration::from_secs(2);
            self.wakeup_trials = self.wakeup_trials.min(50);
        }
        self
    }

    /// The points of the matrix, as (users, items): --points, else every pair of --users and
    /// --backlog, by backlog then users.
    pub fn matrix(&self) -> Vec<(u32, u32)> {
        if !self.points.is_empty() {
            return self.points.clone();
        }
        self.backlog
            .iter()
            .flat_map(|&backlog| self.users.iter().map(move |&users| (users, backlog)))
            .collect()
    }
}

/// A benchmark point, USERSxITEMS: `10000x1000000`.
fn parse_bench_point(text: &str) -> Result<(u32, u32), String> {
    let parsed = text.split_once('x').and_then(|(users, items)| {
        Some((users.trim().parse::<u32>().ok()?, items.trim().parse::<u32>().ok()?))
    });
    match parsed {
        Some((users, items)) if users > 0 && items > 0 => Ok((users, items)),
        _ => Err(format!("`{text}` is not USERSxITEMS, both positive (e.g. 10000x1000000)")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn every_flag_is_well_formed_and_unique() {
        Cli::command().debug_assert();
    }
}
