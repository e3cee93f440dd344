//! The flags of the fault suite (`fairway chaos`) and of the worker process it starts.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Data directory of the suite's own PostgreSQL cluster, kept between runs so that an
    /// immediate restart finds its data; each run starts from a fresh database in it.
    #[arg(long, default_value = "target/chaos-postgres")]
    pub data_dir: PathBuf,

    /// Directory holding the PostgreSQL server binaries [default: as for `serve`].
    #[arg(long, env = "FAIRWAY_PG_BIN")]
    pub pg_bin: Option<PathBuf>,

    /// Data directory of the synchronous standby the suite makes afresh each run with
    /// pg_basebackup, and promotes when it kills the primary.
    #[arg(long, default_value = "target/chaos-standby")]
    pub standby_dir: PathBuf,

    /// Give the brokers only the primary's host, not both: the failover then strands them,
    /// which shows the scenario failing when broken.
    #[arg(long, hide = true)]
    pub single_host_url: bool,

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
    /// The brokers' base URLs (comma-separated); workers are dealt over them, each given its
    /// broker and the next, as `fairway worker --url` takes them.
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

    /// Per mille of claimed items their worker hands back unworked (status released), until
    /// the process reads `calm`.
    #[arg(long, default_value_t = 10)]
    pub release_per_mille: u64,
}
