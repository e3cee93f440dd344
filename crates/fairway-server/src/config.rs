//! The flags of `fairway serve`: every knob of a running broker, with its environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;
use fairway_api::positive_duration;
use fairway_api::retry::{Backoff, RetryPolicy, LONGEST_DELAY, MAX_ATTEMPTS};

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the HTTP server listens on.
    #[arg(long, env = "FAIRWAY_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    #[command(flatten)]
    pub pool: PoolArgs,

    /// How long a claimed work item stays leased to its worker without a heartbeat.
    #[arg(long, env = "FAIRWAY_LEASE", default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// How long a claim first leases its item, when shorter than --lease: the worker's first
    /// heartbeat or report extends it to --lease. An item whose worker never got the answer (or
    /// died at once) is then back within this plus --reap-interval; workers must heartbeat
    /// within it. 0s: off, a claim leases for --lease.
    #[arg(long, env = "FAIRWAY_FIRST_LEASE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub first_lease: Duration,

    /// Retries after a retryable failure before an item fails for good, for jobs submitted
    /// without a `retry` policy (retried at once); a policy's `max_attempts` defaults to this
    /// plus one.
    #[arg(long, env = "FAIRWAY_MAX_RETRIES", default_value_t = 3)]
    pub max_retries: u32,

    #[command(flatten)]
    pub retry: RetryArgs,

    /// How long a submission's Idempotency-Key is remembered: the same request with the same
    /// key within it gets the first answer again and creates nothing. Expired keys are
    /// deleted by the pruner (--retention).
    #[arg(long, env = "FAIRWAY_IDEMPOTENCY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub idempotency_ttl: Duration,

    /// How often the lease reaper looks for expired leases.
    #[arg(long, env = "FAIRWAY_REAP_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub reap_interval: Duration,

    /// How long a querier that makes no work request and holds no lease stays a member of
    /// tenant shards before it is forgotten.
    #[arg(long, env = "FAIRWAY_QUERIER_FORGET_DELAY", default_value = "1m", value_parser = humantime::parse_duration)]
    pub querier_forget_delay: Duration,

    /// How long the requests in flight may take once the broker is told to stop (SIGTERM or
    /// SIGINT). It answers 503 on /readyz, and 503 with Retry-After to waiting long polls and
    /// new claims, at once; lets the claims and reports in flight commit and answer; then exits.
    /// What is still running after this long is cut off.
    #[arg(long, env = "FAIRWAY_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// How long GET /prestop (a Kubernetes preStop hook) holds its answer, with /readyz
    /// answering 503 from its start, so that load balancers stop routing here before SIGTERM
    /// starts the drain. The broker goes on serving meanwhile.
    #[arg(long, env = "FAIRWAY_PRESTOP_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub prestop_delay: Duration,

    /// How long a set of server functions stays in the database once no broker uses it. Each
    /// release installs its functions into a schema of its own, so that brokers of two releases
    /// run side by side during an upgrade or a rollback; every broker marks its set as in use
    /// every quarter of this (at most every minute), and the maintenance leader drops the sets
    /// nobody marked within it.
    #[arg(long, env = "FAIRWAY_FUNCTION_SET_RETENTION", default_value = "1h", value_parser = positive_duration)]
    pub function_set_retention: Duration,

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

    #[command(flatten)]
    pub traces: TraceArgs,

    #[command(flatten)]
    pub tls: TlsArgs,
}

impl ServeArgs {
    /// A broker for tests and the benchmark to run in-process: an ephemeral loopback port, auth
    /// off unless the database holds tokens, and no background vacuum or pruning, so that
    /// nothing moves a test's plans, statistics or jobs under it. Callers change what they need.
    pub fn for_tests() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            pool: PoolArgs { pool_size: 40 },
            lease: Duration::from_secs(300),
            first_lease: Duration::ZERO,
            max_retries: 3,
            retry: RetryArgs {
                retry_backoff: Backoff::Exponential,
                retry_initial: Duration::from_secs(2),
                retry_max: Duration::from_secs(600),
                promote_interval: Duration::from_secs(1),
            },
            reap_interval: Duration::from_secs(1),
            idempotency_ttl: Duration::from_secs(24 * 60 * 60),
            querier_forget_delay: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(20),
            prestop_delay: Duration::from_millis(100),
            function_set_retention: Duration::from_secs(60 * 60),
            max_body_bytes: 1024 * 1024,
            long_poll_max: Duration::from_secs(60),
            batches: BatchArgs { claim_lanes: 4, ending_lanes: 1, batch_max: 32 },
            vacuum: VacuumArgs { vacuum_interval: Duration::ZERO },
            prune: PruneArgs { retention: Duration::ZERO, prune_interval: Duration::from_secs(60) },
            metrics: MetricsArgs {
                metrics_refresh: Duration::from_secs(5),
                metrics_tenant_label: false,
            },
            auth: AuthArgs::default(),
            traces: TraceArgs::default(),
            tls: TlsArgs::default(),
        }
    }
}

/// What a job's `retry` policy leaves out, and how often scheduled items are made ready.
#[derive(Debug, Clone, Copy, Args)]
pub struct RetryArgs {
    /// How a `retry` policy that names no backoff spaces its retries: none (ready again at
    /// once), fixed (--retry-initial each time) or exponential (doubling from --retry-initial
    /// up to --retry-max, with jitter).
    #[arg(long, env = "FAIRWAY_RETRY_BACKOFF", default_value = "exponential", value_parser = parse_backoff)]
    pub retry_backoff: Backoff,

    /// The first retry's delay, for a `retry` policy that names no `initial`.
    #[arg(long, env = "FAIRWAY_RETRY_INITIAL", default_value = "2s", value_parser = retry_delay)]
    pub retry_initial: Duration,

    /// The longest delay an exponential backoff grows to, for a `retry` policy that names no
    /// `max`.
    #[arg(long, env = "FAIRWAY_RETRY_MAX", default_value = "10m", value_parser = retry_delay)]
    pub retry_max: Duration,

    /// How often the promoter makes scheduled items whose time has come ready (a retry's
    /// delay, a job's not_before). Brokers take turns: one promotes at a time.
    #[arg(long, env = "FAIRWAY_PROMOTE_INTERVAL", default_value = "1s", value_parser = positive_duration)]
    pub promote_interval: Duration,
}

impl RetryArgs {
    /// The policy a `retry` object's missing fields come from.
    pub fn defaults(&self, max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: max_retries.saturating_add(1).min(MAX_ATTEMPTS),
            backoff: self.retry_backoff,
            initial: self.retry_initial,
            max: self.retry_max,
        }
    }
}

fn parse_backoff(name: &str) -> Result<Backoff, String> {
    Backoff::parse(name).map_err(|error| error.message)
}

fn retry_delay(text: &str) -> Result<Duration, String> {
    let delay = humantime::parse_duration(text).map_err(|error| error.to_string())?;
    if delay > LONGEST_DELAY {
        return Err("must be at most 7 days".to_owned());
    }
    Ok(delay)
}

/// The broker's connections to PostgreSQL.
#[derive(Debug, Clone, Copy, Args)]
pub struct PoolArgs {
    /// Connections in the broker's database pool.
    #[arg(long, env = "FAIRWAY_DB_POOL_SIZE", default_value_t = 32)]
    pub pool_size: usize,
}

/// Who may use the broker (docs/security.md).
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
    #[arg(long, env = "FAIRWAY_INSECURE_NO_AUTH", value_parser = BoolishValueParser::new())]
    pub insecure_no_auth: bool,

    /// Answer /metrics only to an admin or reader token while auth is on (it is open by
    /// default, as /healthz and /readyz are).
    #[arg(long, env = "FAIRWAY_METRICS_REQUIRE_TOKEN", value_parser = BoolishValueParser::new())]
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

/// Where the broker's OpenTelemetry traces go (docs/operating.md).
#[derive(Debug, Clone, Default, Args)]
pub struct TraceArgs {
    /// Export OpenTelemetry traces over OTLP/HTTP (protobuf) to URL/v1/traces, e.g.
    /// http://127.0.0.1:4318: a span per HTTP request (named by its route), claim batch,
    /// ending batch and submission, continuing the W3C traceparent a job was submitted with.
    /// Off by default: no exporter runs. Spans go out in batches every OTEL_BSP_SCHEDULE_DELAY
    /// milliseconds (default 5000).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// A PEM file of CA certificates to trust, beside the system's, when --otlp-endpoint is an
    /// https:// URL signed by a private CA.
    #[arg(long = "ca-cert", env = "FAIRWAY_CA_CERT", value_name = "PATH")]
    pub otlp_ca_cert: Option<PathBuf>,
}

/// HTTPS: the broker serves plain HTTP unless given a certificate and its key.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// Serve HTTPS with this PEM certificate chain (the server's certificate first). It is read
    /// again on SIGHUP, and within 10 s of the file changing, so a rotated certificate needs no
    /// restart. Needs --tls-key.
    #[arg(long, env = "FAIRWAY_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1), read again with it.
    #[arg(long, env = "FAIRWAY_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// An OTLP/HTTP base URL, without the trailing slash the signal's path is appended after.
fn otlp_endpoint(text: &str) -> Result<String, String> {
    let base = text.trim_end_matches('/');
    let host = base.strip_prefix("http://").or_else(|| base.strip_prefix("https://"));
    match host {
        Some(host) if !host.is_empty() => Ok(base.to_owned()),
        _ => Err("must be an http:// or https:// URL, such as http://127.0.0.1:4318".to_owned()),
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
    #[arg(long, env = "FAIRWAY_METRICS_TENANT_LABEL", value_parser = BoolishValueParser::new())]
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
    /// How many claim transactions run at once, each for a different service. A service's
    /// claims go one transaction at a time, in every broker in turn, since they would race for
    /// the head of the same fair order; claims that arrive meanwhile go together in its next.
    #[arg(long, env = "FAIRWAY_CLAIM_LANES", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub claim_lanes: u16,

    /// How many transactions ending attempts run at once; reports that arrive meanwhile go
    /// together in the next one. Each owner's reports go to one lane, so that two lanes never
    /// wait on each other for an owner's rows.
    #[arg(long, env = "FAIRWAY_ENDING_LANES", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub ending_lanes: u16,

    /// Most requests one such transaction serves. Batches smaller than the number of workers
    /// let a claim transaction and an ending transaction run side by side, on different
    /// workers' requests.
    #[arg(long, env = "FAIRWAY_BATCH_MAX", default_value_t = 12,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_max: u16,
}
