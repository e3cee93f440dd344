//! The flags of the commands that talk to a running broker: `admin`, `submit`, `worker` and
//! `demo`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use fairway_api::policy::PolicyChange;
use fairway_api::positive_duration;

/// How the command-line tools reach a broker.
#[derive(Debug, Clone, Args)]
pub struct BrokerAddress {
    /// The broker's base URL, or several, comma-separated: a request goes to the next while
    /// one refuses the connection or answers 503 (draining), and stays with the one that
    /// answered.
    #[arg(long, env = "FAIRWAY_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,

    /// Bearer token sent with every request. An empty one is none.
    #[arg(long, env = "FAIRWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// A PEM file of CA certificates to trust, beside the system's, for an https:// broker
    /// whose certificate a private CA signed.
    #[arg(long, env = "FAIRWAY_CA_CERT", value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,
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
    /// Each service's queue: ready, running, paused, oldest ready, claims per second; or one
    /// service's cap and rate limit.
    Services {
        #[command(subcommand)]
        command: Option<ServiceCommand>,
    },
    /// Rows of the fair order's user_work table: who has work where; or one user's policy.
    #[command(args_conflicts_with_subcommands = true)]
    Users {
        #[command(subcommand)]
        command: Option<UserCommand>,
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
    /// Which build the broker is (release, server-function revision, last schema migration)
    /// and what its database holds: during an upgrade, ask each broker's URL in turn.
    Version,
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
    /// Put every item that failed for good back to ready, with a fresh retry budget.
    Retry { job_id: uuid::Uuid },
    /// Pause, resume, cancel or retry every job the filter matches (at least one filter).
    Bulk {
        action: BulkAction,
        /// Only this user's jobs.
        #[arg(long)]
        user: Option<String>,
        /// Only this tenant's jobs.
        #[arg(long)]
        tenant: Option<String>,
        /// Only jobs in this status (running, failed, complete_with_errors, ...).
        #[arg(long)]
        status: Option<String>,
        /// Only jobs with a step on this service.
        #[arg(long)]
        service: Option<String>,
        /// Only jobs submitted before this RFC 3339 time.
        #[arg(long)]
        submitted_before: Option<String>,
        /// Count the jobs the filter matches now, and change none.
        #[arg(long)]
        dry_run: bool,
    },
}

/// What `fairway admin jobs bulk` does to each job.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BulkAction {
    Pause,
    Resume,
    Cancel,
    Retry,
}

impl BulkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Cancel => "cancel",
            Self::Retry => "retry",
        }
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum TenantCommand {
    /// One tenant.
    Show { tenant: String },
    /// Set a tenant's limits and policy, creating it if needed; a flag left out keeps its value.
    Set {
        tenant: String,
        /// Queriers that serve the tenant; 0: all of them.
        #[arg(long, value_parser = clap::value_parser!(i32).range(0..))]
        max_queriers: Option<i32>,
        /// Most ready items the tenant may have waiting; 0: no limit.
        #[arg(long, value_parser = clap::value_parser!(i32).range(0..))]
        max_outstanding: Option<i32>,
        #[command(flatten)]
        rank: RankArgs,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum UserCommand {
    /// One user's weight, tier, cap, rate limit and running items.
    Show { user: String },
    /// Set a user's weight, tier, cap and rate limit, for a user not yet seen too; a flag left
    /// out keeps its value. Every broker's claims obey it from their next batch.
    Set {
        user: String,
        #[command(flatten)]
        rank: RankArgs,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ServiceCommand {
    /// One service's cap, rate limit and running items.
    Show { service: String },
    /// Set a service's cap and rate limit, for a service not yet seen too; a flag left out keeps
    /// its value. Every broker's claims obey it from their next batch.
    Set {
        service: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

/// A cap and a rate limit, as `set` takes them for users, tenants and services.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Most items running at once, over every broker; 0: no cap.
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..))]
    pub max_running: Option<i32>,
    /// Items handed out per second, over every broker; 0: no limit.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Items handed out at once after a quiet spell (at least 1).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub burst: Option<i32>,
}

/// A weight and a tier, as `set` takes them for users and tenants.
#[derive(Debug, Clone, Args)]
pub struct RankArgs {
    /// The share of the workers against the other backlogged users (or tenants) (1–1000).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub weight: Option<i32>,
    /// The operator's tier (1–5; 3 unless set): a lower tier is served first, before fairness
    /// among the users of a tenant (or the tenants of a component).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=5))]
    pub tier: Option<i32>,
}

impl LimitArgs {
    /// The change these flags make, with a weight and tier beside them (none for a service).
    pub fn change(&self, rank: Option<&RankArgs>) -> PolicyChange {
        PolicyChange {
            weight: rank.and_then(|rank| rank.weight),
            tier: rank.and_then(|rank| rank.tier),
            max_running: self.max_running,
            rate_per_second: self.rate,
            burst: self.burst,
        }
    }
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

    /// Sent as the Idempotency-Key header (1 to 255 printable ASCII characters): running the
    /// same command again with the same key prints the first job's id and creates no second
    /// job, for as long as the broker's --idempotency-ttl.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
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

    /// Where to write the chart (docs/demo/shares.svg is the one the docs show).
    #[arg(long, default_value = "target/demo/shares.svg")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// The service whose items this worker does.
    #[arg(long, env = "FAIRWAY_WORKER_SERVICE")]
    pub service: String,

    /// The querier (pod) name this worker asks as; tenant shards are drawn over queriers.
    /// Default: the host name and the process id, so that each worker process is its own
    /// querier and a restart is a new one.
    #[arg(long, env = "FAIRWAY_WORKER_QUERIER")]
    pub querier: Option<String>,

    /// Items worked on at once, each by its own run of COMMAND.
    #[arg(long, env = "FAIRWAY_WORKER_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,

    /// How long one work request waits for work to appear (at most 60 s).
    #[arg(long, env = "FAIRWAY_WORKER_WAIT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// How often a heartbeat extends the lease of an item whose command still runs, or whose
    /// report waits for a broker.
    #[arg(long, env = "FAIRWAY_WORKER_HEARTBEAT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub heartbeat: Duration,

    /// How long the worker goes on after SIGTERM or SIGINT, finishing the items it holds and
    /// delivering their reports, before it exits naming the reports it could not deliver.
    /// Keep it a little under the pod's termination grace period.
    #[arg(long, env = "FAIRWAY_WORKER_STOP_TIMEOUT", default_value = "110s", value_parser = humantime::parse_duration)]
    pub stop_timeout: Duration,

    /// The command run per item, with the item's JSON on standard input. Exit 0 with a JSON
    /// array on standard output: successful, those are the results. Otherwise: failed, with
    /// the end of standard error as the error. When the item's job was submitted with a W3C
    /// traceparent, the command gets it as TRACEPARENT, to continue the producer's trace.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}
