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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the broker's HTTP server.
    Serve(ServeArgs),
    /// Start the private PostgreSQL server, run COMMAND with DATABASE_URL pointing at it, then
    /// stop the server (and, with --ephemeral, delete its data directory).
    Postgres(PostgresArgs),
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

    /// Retries after a retryable failure before an item fails for good.
    #[arg(long, env = "FAIRWAY_MAX_RETRIES", default_value_t = 3)]
    pub max_retries: u32,

    /// How often the lease reaper looks for expired leases.
    #[arg(long, env = "FAIRWAY_REAP_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub reap_interval: Duration,

    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[arg(long, env = "FAIRWAY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
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
