//! Where the broker's database is, and the flags of `fairway postgres`.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::Args;

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
    #[arg(long, env = "FAIRWAY_NO_EMBEDDED_POSTGRES", value_parser = BoolishValueParser::new())]
    pub no_embedded_postgres: bool,
}

/// The flags of `fairway postgres`.
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
