//! The flags of `fairway bench`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use fairway_devdb::DatabaseArgs;
use fairway_server::config::{BatchArgs, PoolArgs, VacuumArgs};

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
    /// matching steps in submission order (docs/strategies.md).
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
    pub pool: PoolArgs,

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

    /// Beside the matrix, `fair` twice more at 1,000 users × 10,000 items where every user has
    /// ready work in this many services (0 or 1: not run). Path `fair_services` claims from one
    /// of them, the others' work a few items a user: compare it with `fair` at the same point,
    /// since a claim's cost must not grow with the services a user has work in. Path
    /// `fair_every_service` deals the backlog over all of them and each worker claims from one,
    /// as a workflow's services do, so that each claim may find its queue row behind its user.
    #[arg(long, default_value_t = 4)]
    pub services_per_user: u32,

    /// Beside the matrix, `fair` twice more at this many users × 10,000 items (0: not run):
    /// `fair_no_policies`, then `fair_policies`, where a third of the users are weighted 1 to
    /// 8, a tenth capped at one running item and a tenth held to one item a second.
    #[arg(long, default_value_t = 1_000)]
    pub policy_users: u32,

    /// Beside the matrix, `fair` at 1,000 users × 10,000 items in one service
    /// (`fair_one_lane`), then in two services, half the workers claiming from each, once per
    /// percentage given here of users with work in both (`fair_two_lanes_<percent>`); the
    /// others have work in one. Each service's claims run in a lane of their own, so two
    /// services should claim at least as fast as one. Not run unless given, as `make bench`
    /// gives it: `--lane-shares 0,10,50`.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(0..=100))]
    pub lane_shares: Vec<u8>,

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
