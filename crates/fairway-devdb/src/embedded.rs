//! The private PostgreSQL server: a cluster started from the system's PostgreSQL binaries,
//! used by `fairway serve` when no database URL is given, by the benchmark and by
//! `fairway postgres -- COMMAND` (which `make test` uses).
//!
//! The server listens only on a unix socket in a directory of its own, so it never collides
//! with another PostgreSQL on the machine and needs no password: the cluster is initialised
//! with `trust` authentication for the `postgres` superuser. Durability settings are left at
//! PostgreSQL's defaults (fsync and synchronous_commit on) so measurements resemble production.
//!
//! PostgreSQL refuses to run as root. When fairway runs as root, `initdb` and `pg_ctl` run as
//! the `postgres` system user, the data directory is handed to that user, and if that user
//! cannot reach the requested directory (say, under `/root`, which is mode 700) the cluster
//! goes to a directory named after the requested one under the system temporary directory.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid, User};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

/// Port of the private server. It only names the socket file (`.s.PGSQL.<port>`), and every
/// cluster has a socket directory of its own, so one fixed number never collides.
const PORT: u16 = 5432;
/// Superuser created by initdb and used in connection strings.
const SUPERUSER: &str = "postgres";
/// System user PostgreSQL runs as when fairway runs as root.
const SYSTEM_USER: &str = "postgres";
/// Longest socket path we accept: `sun_path` holds 108 bytes on Linux and 104 on the BSDs,
/// NUL included, so stay clear of both.
const MAX_SOCKET_PATH: usize = 100;
/// Where Debian and Ubuntu install each major version's server binaries (`<root>/<N>/bin`).
const VERSIONED_ROOT: &str = "/usr/lib/postgresql";
/// Server log, inside the data directory.
const LOG_FILE: &str = "postgres.log";
/// Socket directory, inside the data directory when the path is short enough.
const SOCKET_SUBDIR: &str = "socket";
/// Lines of a log or of a tool's output quoted in error messages.
const TAIL_LINES: usize = 25;
/// How long the command gets to exit after a forwarded signal before it is killed.
const CHILD_GRACE: Duration = Duration::from_secs(10);
/// Connection attempt timeout for `create_database_if_missing`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries found ({searched}); install the PostgreSQL server \
         (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL"
    )]
    BinariesNotFound { searched: String },

    #[error(
        "cannot pick a default data directory: neither XDG_DATA_HOME nor HOME is set; \
         pass --data-dir or set DATABASE_URL"
    )]
    NoDefaultDataDir,

    #[error(
        "running as root, but there is no `{SYSTEM_USER}` system user to run PostgreSQL as \
         (PostgreSQL refuses to run as root); install the PostgreSQL server package, which \
         creates it, run fairway as an ordinary user, or set DATABASE_URL"
    )]
    NoPostgresUser,

    #[error("cannot look up the `{SYSTEM_USER}` system user: {0}")]
    UserLookup(#[source] nix::Error),

    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "data directory {} exists, is not empty and holds no PostgreSQL cluster \
         (no PG_VERSION); pass a new or empty --data-dir",
        .0.display()
    )]
    NotACluster(PathBuf),

    #[error(
        "the `{SYSTEM_USER}` user cannot use data directory {} nor the fallback {}; \
         pass a --data-dir that user can write to",
        requested.display(),
        fallback.display()
    )]
    DataDirUnreachable { requested: PathBuf, fallback: PathBuf },

    #[error("initdb failed for {} ({status}):\n{output}", data_dir.display())]
    Initdb { data_dir: PathBuf, status: String, output: String },

    #[error(
        "PostgreSQL failed to start on {} ({status}); pg_ctl said:\n{output}\n\
         last lines of {}:\n{log_tail}",
        data_dir.display(),
        log.display()
    )]
    Start { data_dir: PathBuf, status: String, output: String, log: PathBuf, log_tail: String },

    #[error("pg_basebackup into {} failed ({status}):\n{output}", data_dir.display())]
    Basebackup { data_dir: PathBuf, status: String, output: String },

    #[error(
        "pg_ctl reports a server running on {}, but its postmaster.pid is unusable ({detail}); \
         if no server is running there, remove postmaster.pid and retry",
        data_dir.display()
    )]
    RunningServerUnknown { data_dir: PathBuf, detail: String },

    #[error(
        "stopping PostgreSQL on {} failed ({status}):\n{output}\nlast lines of {}:\n{log_tail}",
        data_dir.display(),
        log.display()
    )]
    Stop { data_dir: PathBuf, status: String, output: String, log: PathBuf, log_tail: String },

    #[error(
        "cannot connect to the private PostgreSQL server ({connection}): {}",
        fairway_pg::describe(source)
    )]
    Connect {
        connection: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error("timed out connecting to the private PostgreSQL server ({connection})")]
    ConnectTimeout { connection: String },

    #[error("cannot create database {name:?}: {}", fairway_pg::describe(source))]
    CreateDatabase {
        name: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error("no command given to run")]
    NoCommand,

    #[error("cannot run `{command}`: {source}")]
    Command {
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] io::Error),
}

/// The user the PostgreSQL tools run as when it is not the current one.
#[derive(Debug, Clone)]
struct RunAs {
    uid: Uid,
    gid: Gid,
}

/// Runs the PostgreSQL tools of one installation as the right user.
#[derive(Debug, Clone)]
struct Tools {
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
}

impl Tools {
    fn command(&self, tool: &str) -> std::process::Command {
        command_as(&self.bin_dir.join(tool), self.run_as.as_ref())
    }

    /// Runs a tool to completion, capturing its output (pg_ctl's chatter must not reach the
    /// stdout of the command we run for the user).
    async fn output(&self, tool: &str, args: &[&std::ffi::OsStr]) -> Result<Output, EmbeddedError> {
        let path = self.bin_dir.join(tool);
        let mut command = tokio::process::Command::from(self.command(tool));
        command.args(args).stdin(Stdio::null());
        command.output().await.map_err(|source| EmbeddedError::Io { action: "run", path, source })
    }
}

/// A command that runs `program` as `run_as` (or as ourselves), from `/` so a tool running as
/// another user does not trip over a working directory it may not enter.
fn command_as(program: &Path, run_as: Option<&RunAs>) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command.current_dir("/");
    if let Some(user) = run_as {
        // std drops root's supplementary groups when it changes uid, so nothing of root's leaks.
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    command
}

/// A running private PostgreSQL server.
///
/// Stop it with [`EmbeddedPostgres::stop`]. If it is dropped without `stop`, `Drop` makes a
/// best-effort blocking `pg_ctl stop -m fast` (and honours [`EmbeddedPostgres::ephemeral`]) so
/// a panicking caller does not leave a server behind.
///
/// When `start` finds a server already running on the data directory (from an earlier run
/// that did not shut down), it reuses that server and leaves it running on `stop`: we only
/// stop what we started, since something else may be using it.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    /// Socket directory (or host) and port clients connect to.
    host: String,
    port: u16,
    tools: Tools,
    /// False when we reused a server that was already running.
    started_by_us: bool,
    /// Delete the data directory on stop.
    ephemeral: bool,
    /// Directories this run created for the data directory, innermost first.
    created_dirs: Vec<PathBuf>,
    /// A socket directory outside the data directory (path-length fallback) to remove on stop.
    external_socket_dir: Option<PathBuf>,
    /// Server settings beyond `SERVER_SETTINGS`, as (name, value).
    settings: Vec<(String, String)>,
    /// Its postmaster was killed ([`EmbeddedPostgres::kill`]): nothing is left to stop.
    killed: bool,
    stopped: bool,
}

impl EmbeddedPostgres {
    /// Starts (initdb first if the directory has no cluster) the server. data_dir None = the default
    /// (`$XDG_DATA_HOME/fairway/postgres`, else `$HOME/.local/share/fairway/postgres`; as root
    /// `/var/lib/fairway/postgres`), kept between runs. pg_bin None = the newest
    /// `/usr/lib/postgresql/<N>/bin` with initdb (preferring the version of an existing cluster),
    /// else the PATH.
    pub async fn start(
        data_dir: Option<&Path>,
        pg_bin: Option<&Path>,
    ) -> Result<Self, EmbeddedError> {
        Self::start_inner(data_dir, pg_bin, false, Vec::new()).await
    }

    /// As [`EmbeddedPostgres::start`], with server settings beyond the defaults, as (name,
    /// value): a primary's `synchronous_standby_names`, say. A server found already running
    /// keeps the settings it has.
    pub async fn start_with_settings(
        data_dir: Option<&Path>,
        pg_bin: Option<&Path>,
        settings: &[(&str, &str)],
    ) -> Result<Self, EmbeddedError> {
        let settings =
            settings.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        Self::start_inner(data_dir, pg_bin, false, settings).await
    }

    /// A streaming standby of `primary`, made afresh in `data_dir` (whatever it held is
    /// deleted) with `pg_basebackup -R` and started as a hot standby named `name`: its
    /// `cluster_name`, which the primary's `synchronous_standby_names` can name, since the
    /// standby's WAL receiver uses it as its application name.
    pub async fn start_standby(
        primary: &EmbeddedPostgres,
        data_dir: &Path,
        name: &str,
    ) -> Result<Self, EmbeddedError> {
        let data_dir = std::path::absolute(data_dir).map_err(|source| EmbeddedError::Io {
            action: "resolve",
            path: data_dir.to_path_buf(),
            source,
        })?;
        if data_dir.join("PG_VERSION").is_file() {
            // A standby of an earlier run, maybe still running (promoted, or left behind).
            let _ = primary
                .tools
                .output(
                    "pg_ctl",
                    &[
                        "stop".as_ref(),
                        "-D".as_ref(),
                        data_dir.as_os_str(),
                        "-m".as_ref(),
                        "immediate".as_ref(),
                        "-w".as_ref(),
                    ],
                )
                .await;
            std::fs::remove_dir_all(&data_dir).map_err(|source| EmbeddedError::Io {
                action: "remove",
                path: data_dir.clone(),
                source,
            })?;
        }
        let (data_dir, _) = prepare_data_dir(&data_dir, primary.tools.run_as.as_ref()).await?;
        let port = primary.port.to_string();
        let output = primary
            .tools
            .output(
                "pg_basebackup",
                &[
                    "-D".as_ref(),
                    data_dir.as_os_str(),
                    "-h".as_ref(),
                    primary.host.as_ref(),
                    "-p".as_ref(),
                    port.as_ref(),
                    "-U".as_ref(),
                    SUPERUSER.as_ref(),
                    "-X".as_ref(),
                    "stream".as_ref(),
                    "-c".as_ref(),
                    "fast".as_ref(),
                    // standby.signal, and primary_conninfo naming the primary's socket.
                    "-R".as_ref(),
                ],
            )
            .await?;
        if !output.status.success() {
            return Err(EmbeddedError::Basebackup {
                data_dir,
                status: describe_status(output.status),
                output: tail(&output_text(&output), TAIL_LINES),
            });
        }
        // The copy carries the primary's socket directory (its lock file would stop the
        // standby from starting) and log; neither is the standby's.
        let _ = std::fs::remove_dir_all(data_dir.join(SOCKET_SUBDIR));
        let _ = std::fs::remove_file(data_dir.join(LOG_FILE));
        let settings = vec![
            ("cluster_name".to_owned(), name.to_owned()),
            // After the primary restarts, the standby is back within this, not the default 5 s
            // during which a synchronous primary's commits wait.
            ("wal_retrieve_retry_interval".to_owned(), "200ms".to_owned()),
        ];
        Self::start_inner(Some(&data_dir), Some(&primary.tools.bin_dir), false, settings).await
    }

    /// Promotes a standby to a primary (`pg_ctl promote -w`): it leaves recovery and takes
    /// writes.
    pub async fn promote(&self) -> Result<(), EmbeddedError> {
        let log = self.data_dir.join(LOG_FILE);
        let args: [&std::ffi::OsStr; 4] =
            ["promote".as_ref(), "-w".as_ref(), "-D".as_ref(), self.data_dir.as_os_str()];
        let output = self.tools.output("pg_ctl", &args).await?;
        if !output.status.success() {
            return Err(self.start_failed(&output, log));
        }
        Ok(())
    }

    /// `kill -9` of the postmaster, as a machine lost would leave it: no shutdown, no
    /// checkpoint; its backends end on their own when they see it gone. The server is not
    /// started again, and [`EmbeddedPostgres::stop`] then has nothing to stop.
    pub fn kill(&mut self) -> Result<(), EmbeddedError> {
        let pid_file = self.data_dir.join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).map_err(|source| EmbeddedError::Io {
            action: "read",
            path: pid_file.clone(),
            source,
        })?;
        let pid = text.lines().next().and_then(|line| line.trim().parse::<i32>().ok()).ok_or_else(
            || EmbeddedError::RunningServerUnknown {
                data_dir: self.data_dir.clone(),
                detail: "no pid on its first line".to_owned(),
            },
        )?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
            .map_err(|errno| EmbeddedError::Io {
                action: "kill the postmaster of",
                path: self.data_dir.clone(),
                source: errno.into(),
            })?;
        self.killed = true;
        Ok(())
    }

    /// The socket directory (or host) clients connect to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Marks the server ephemeral: [`EmbeddedPostgres::stop`] deletes its data directory
    /// (and any directories this run created to hold it). Deletion is skipped, with a
    /// warning, when the server was already running before `start`, as it is not ours to stop.
    /// Beware of marking a server on the default (kept) data directory ephemeral: its data goes.
    pub fn ephemeral(mut self) -> Self {
        self.ephemeral = true;
        self
    }

    /// key=value connection string for `dbname`, connecting as the cluster's superuser over
    /// the unix socket, e.g. `host=/path/to/sockdir port=5432 user=postgres dbname=fairway`.
    pub fn connection_string(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user={} dbname={}",
            quote_conn_value(&self.host),
            self.port,
            quote_conn_value(SUPERUSER),
            quote_conn_value(dbname)
        )
    }

    /// A connection string naming several servers, tried in turn for the one that takes
    /// writes (`target_session_attrs=read-write`), as libpq does: brokers given it follow a
    /// failover to the promoted standby.
    pub fn failover_connection_string(servers: &[&EmbeddedPostgres], dbname: &str) -> String {
        let hosts: Vec<&str> = servers.iter().map(|server| server.host.as_str()).collect();
        let ports: Vec<String> = servers.iter().map(|server| server.port.to_string()).collect();
        format!(
            "host={} port={} user={} dbname={} target_session_attrs=read-write",
            quote_conn_value(&hosts.join(",")),
            ports.join(","),
            quote_conn_value(SUPERUSER),
            quote_conn_value(dbname)
        )
    }

    /// CREATE DATABASE `dbname` if it does not exist.
    pub async fn create_database_if_missing(&self, dbname: &str) -> Result<(), EmbeddedError> {
        let connection = self.connection_string("postgres");
        let connect = tokio_postgres::connect(&connection, NoTls);
        let (client, conn) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(source)) => return Err(EmbeddedError::Connect { connection, source }),
            Err(_) => return Err(EmbeddedError::ConnectTimeout { connection }),
        };
        let driver = tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "connection to the private server ended");
            }
        });
        let create_error =
            |source| EmbeddedError::CreateDatabase { name: dbname.to_owned(), source };
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&dbname])
            .await
            .map_err(create_error)?
            .is_some();
        if !exists {
            let sql = format!("CREATE DATABASE {}", quote_ident(dbname));
            match client.batch_execute(&sql).await {
                Ok(()) => tracing::info!(database = dbname, "created database"),
                // Someone else created it between our check and now: that is what we wanted.
                Err(error) if error.code() == Some(&SqlState::DUPLICATE_DATABASE) => {}
                Err(error) => return Err(create_error(error)),
            }
        }
        drop(client);
        let _ = driver.await;
        Ok(())
    }

    /// Fast shutdown (`pg_ctl stop -m fast -w`), then removes the data directory if the server
    /// is ephemeral. A server that was already running before `start` is left running.
    pub async fn stop(mut self) -> Result<(), EmbeddedError> {
        self.stopped = true;
        if self.started_by_us && !self.killed {
            let output = self
                .tools
                .output(
                    "pg_ctl",
                    &[
                        "stop".as_ref(),
                        "-D".as_ref(),
                        self.data_dir.as_os_str(),
                        "-m".as_ref(),
                        "fast".as_ref(),
                        "-w".as_ref(),
                    ],
                )
                .await?;
            if !output.status.success() {
                // The server may still be running: keep its data directory whatever `ephemeral` says.
                let log = self.data_dir.join(LOG_FILE);
                return Err(EmbeddedError::Stop {
                    data_dir: self.data_dir.clone(),
                    status: describe_status(output.status),
                    output: tail(&output_text(&output), TAIL_LINES),
                    log_tail: log_tail(&log),
                    log,
                });
            }
            tracing::info!(data_dir = %self.data_dir.display(), "stopped private PostgreSQL");
        }
        self.remove_leftovers();
        Ok(())
    }

    /// Crashes and restarts the server at once (`pg_ctl restart -m immediate -w`), as a power
    /// cut would: every connection drops and the next start replays the WAL. The fault suite
    /// uses it; the server keeps its socket, port and options.
    pub async fn restart_immediately(&self) -> Result<(), EmbeddedError> {
        let log = self.data_dir.join(LOG_FILE);
        let args: [&std::ffi::OsStr; 8] = [
            "restart".as_ref(),
            "-m".as_ref(),
            "immediate".as_ref(),
            "-w".as_ref(),
            "-D".as_ref(),
            self.data_dir.as_os_str(),
            // Without a log file the server would inherit pg_ctl's output pipes, and the
            // restart would never seem to end.
            "-l".as_ref(),
            log.as_os_str(),
        ];
        let output = self.tools.output("pg_ctl", &args).await?;
        if !output.status.success() {
            return Err(self.start_failed(&output, log));
        }
        Ok(())
    }

    /// Why `pg_ctl` could not start the server: what it said, and the end of the server's log.
    fn start_failed(&self, output: &Output, log: PathBuf) -> EmbeddedError {
        EmbeddedError::Start {
            data_dir: self.data_dir.clone(),
            status: describe_status(output.status),
            output: tail(&output_text(output), TAIL_LINES),
            log_tail: log_tail(&log),
            log,
        }
    }

    /// Removes what a stopped server leaves that is ours to remove.
    fn remove_leftovers(&self) {
        if let Some(dir) = &self.external_socket_dir {
            // Only empty once the server is gone; a reused server still has its socket there.
            let _ = std::fs::remove_dir(dir);
        }
        if !self.ephemeral {
            return;
        }
        if !self.started_by_us {
            tracing::warn!(
                data_dir = %self.data_dir.display(),
                "not deleting the data directory of a server this run did not start"
            );
            return;
        }
        // Never delete a directory that is neither ours nor a cluster (a mistyped --data-dir).
        let ours = self.created_dirs.first() == Some(&self.data_dir);
        if ours || self.data_dir.join("PG_VERSION").is_file() {
            if let Err(error) = std::fs::remove_dir_all(&self.data_dir) {
                tracing::warn!(data_dir = %self.data_dir.display(), %error, "cannot delete the data directory");
            }
        }
        remove_empty_dirs(&self.created_dirs);
    }

    async fn start_inner(
        data_dir: Option<&Path>,
        pg_bin: Option<&Path>,
        ephemeral: bool,
        settings: Vec<(String, String)>,
    ) -> Result<Self, EmbeddedError> {
        let run_as = if Uid::effective().is_root() {
            match User::from_name(SYSTEM_USER) {
                Ok(Some(user)) => Some(RunAs { uid: user.uid, gid: user.gid }),
                Ok(None) => return Err(EmbeddedError::NoPostgresUser),
                Err(error) => return Err(EmbeddedError::UserLookup(error)),
            }
        } else {
            None
        };
        let requested = match data_dir {
            Some(dir) => dir.to_path_buf(),
            None => default_data_dir(
                run_as.is_some(),
                std::env::var_os("XDG_DATA_HOME"),
                std::env::var_os("HOME"),
            )
            .ok_or(EmbeddedError::NoDefaultDataDir)?,
        };
        let requested = std::path::absolute(&requested).map_err(|source| EmbeddedError::Io {
            action: "resolve",
            path: requested.clone(),
            source,
        })?;
        let (data_dir, created_dirs) = prepare_data_dir(&requested, run_as.as_ref()).await?;

        let mut server = EmbeddedPostgres {
            host: String::new(),
            port: PORT,
            tools: Tools { bin_dir: PathBuf::new(), run_as },
            started_by_us: false,
            ephemeral,
            created_dirs,
            external_socket_dir: None,
            settings,
            killed: false,
            stopped: true, // nothing to stop until the server is up
            data_dir,
        };
        match server.boot(pg_bin).await {
            Ok(()) => Ok(server),
            Err(error) => {
                // Clean up what this run created. An ephemeral cluster goes entirely; a kept one
                // stays (with its log) for the operator to inspect, only empty new dirs go.
                if server.ephemeral && server.created_dirs.first() == Some(&server.data_dir) {
                    let _ = std::fs::remove_dir_all(&server.data_dir);
                }
                remove_empty_dirs(&server.created_dirs);
                if let Some(dir) = &server.external_socket_dir {
                    let _ = std::fs::remove_dir(dir);
                }
                Err(error)
            }
        }
    }

    /// Finds the binaries, initialises the cluster if needed and starts (or adopts) the server.
    async fn boot(&mut self, pg_bin: Option<&Path>) -> Result<(), EmbeddedError> {
        let version_file = self.data_dir.join("PG_VERSION");
        let cluster_version =
            std::fs::read_to_string(&version_file).ok().map(|text| text.trim().to_owned());
        self.tools.bin_dir = discover_binaries(pg_bin, cluster_version.as_deref())?;
        let data_arg = self.data_dir.clone().into_os_string();

        if cluster_version.is_some() {
            let status =
                self.tools.output("pg_ctl", &["status".as_ref(), "-D".as_ref(), &data_arg]).await?;
            // pg_ctl status exits 0 exactly when a server is running on the directory.
            if status.status.success() {
                return self.adopt_running_server();
            }
        } else {
            self.initdb().await?;
        }

        let socket_dir = socket_dir_for(&self.data_dir, PORT);
        if !socket_dir.starts_with(&self.data_dir) {
            tracing::info!(
                socket_dir = %socket_dir.display(),
                "data directory path too long for a unix socket; using a short socket directory"
            );
            if !socket_dir.exists() {
                self.external_socket_dir = Some(socket_dir.clone());
            }
        }
        create_owned_dir(&socket_dir, self.tools.run_as.as_ref())?;

        let log = self.data_dir.join(LOG_FILE);
        let options = server_options(&socket_dir, PORT, &self.settings);
        let output = self
            .tools
            .output(
                "pg_ctl",
                &[
                    "start".as_ref(),
                    "-w".as_ref(),
                    "-D".as_ref(),
                    &data_arg,
                    "-l".as_ref(),
                    log.as_os_str(),
                    "-o".as_ref(),
                    options.as_ref(),
                ],
            )
            .await?;
        if !output.status.success() {
            return Err(self.start_failed(&output, log));
        }
        self.host = socket_dir.to_string_lossy().into_owned();
        self.started_by_us = true;
        self.stopped = false;
        tracing::info!(
            data_dir = %self.data_dir.display(),
            socket_dir = %socket_dir.display(),
            bin_dir = %self.tools.bin_dir.display(),
            "started private PostgreSQL"
        );
        Ok(())
    }

    async fn initdb(&self) -> Result<(), EmbeddedError> {
        let output = self
            .tools
            .output(
                "initdb",
                &[
                    "-D".as_ref(),
                    self.data_dir.as_os_str(),
                    "-U".as_ref(),
                    SUPERUSER.as_ref(),
                    "-A".as_ref(),
                    "trust".as_ref(),
                    "--encoding=UTF8".as_ref(),
                    "--no-locale".as_ref(),
                ],
            )
            .await?;
        if !output.status.success() {
            return Err(EmbeddedError::Initdb {
                data_dir: self.data_dir.clone(),
                status: describe_status(output.status),
                output: tail(&output_text(&output), TAIL_LINES),
            });
        }
        tracing::info!(data_dir = %self.data_dir.display(), "initialised PostgreSQL cluster");
        Ok(())
    }

    /// Connects to a server found already running on the data directory, wherever it listens.
    fn adopt_running_server(&mut self) -> Result<(), EmbeddedError> {
        let pid_file = self.data_dir.join("postmaster.pid");
        let unusable = |detail: String| EmbeddedError::RunningServerUnknown {
            data_dir: self.data_dir.clone(),
            detail,
        };
        let text =
            std::fs::read_to_string(&pid_file).map_err(|error| unusable(error.to_string()))?;
        let (host, port) = parse_postmaster_pid(&text)
            .ok_or_else(|| unusable("no port or listen address in it".to_owned()))?;
        tracing::warn!(
            data_dir = %self.data_dir.display(),
            host = %host,
            port,
            "reusing the PostgreSQL server already running on this data directory; it will be left running"
        );
        self.host = host;
        self.port = port;
        Ok(())
    }
}

impl Drop for EmbeddedPostgres {
    /// Best effort for a server that was never `stop`ped (a panic, an early return): stop it
    /// synchronously rather than leave it running. `stop` is the proper way.
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if self.started_by_us && !self.killed {
            let status = self
                .tools
                .command("pg_ctl")
                .arg("stop")
                .arg("-D")
                .arg(&self.data_dir)
                .args(["-m", "fast", "-w"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !matches!(status, Ok(status) if status.success()) {
                // Leave the data directory alone: the server may still be using it.
                tracing::warn!(data_dir = %self.data_dir.display(), "could not stop private PostgreSQL on drop");
                return;
            }
        }
        self.remove_leftovers();
    }
}

/// Implements `fairway postgres [--data-dir D] [--pg-bin B] [--ephemeral] [--database NAME] -- COMMAND...`:
/// starts the server, creates the database, runs COMMAND with `DATABASE_URL` set (inheriting
/// stdio), then stops the server (deleting the data directory with `--ephemeral`) whatever the
/// command's outcome, also on Ctrl-C/SIGTERM/SIGHUP, and returns the command's exit code
/// (128 + signal number if it died of a signal).
///
/// `--ephemeral` without `--data-dir` uses a fresh directory under the temporary directory,
/// never the default (kept) one.
pub async fn run_command_with_postgres(args: &crate::PostgresArgs) -> Result<i32, EmbeddedError> {
    let (program, rest) = args.command.split_first().ok_or(EmbeddedError::NoCommand)?;
    // Installed first: from here on a signal no longer kills us, so we always get to clean up.
    let mut signals = SignalWatch::install()?;

    let data_dir = match (&args.data_dir, args.ephemeral) {
        (Some(dir), _) => Some(dir.clone()),
        (None, true) => Some(fresh_ephemeral_dir()),
        (None, false) => None,
    };
    let server = EmbeddedPostgres::start_inner(
        data_dir.as_deref(),
        args.pg_bin.as_deref(),
        args.ephemeral,
        Vec::new(),
    )
    .await?;

    let outcome = run_child(&server, args, program, rest, &mut signals).await;
    let stopped = server.stop().await;
    match (outcome, stopped) {
        (Ok(code), Ok(())) => Ok(code),
        (Err(error), Ok(())) => Err(error),
        (Err(error), Err(stop_error)) => {
            tracing::error!(error = %stop_error, "stopping the private server failed too");
            Err(error)
        }
        // A failing command's code matters more than the stop error, which we still report.
        (Ok(code), Err(stop_error)) if code != 0 => {
            tracing::error!(error = %stop_error, "stopping the private server failed");
            eprintln!("fairway: {stop_error}");
            Ok(code)
        }
        (Ok(_), Err(stop_error)) => Err(stop_error),
    }
}

/// Creates the database and runs the command, forwarding a termination signal to it.
async fn run_child(
    server: &EmbeddedPostgres,
    args: &crate::PostgresArgs,
    program: &str,
    rest: &[String],
    signals: &mut SignalWatch,
) -> Result<i32, EmbeddedError> {
    server.create_database_if_missing(&args.database).await?;
    if let Some(sig) = signals.received() {
        // Interrupted while the server was starting: do not start the command at all.
        return Ok(128 + sig as i32);
    }
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .env("DATABASE_URL", server.connection_string(&args.database))
        .spawn()
        .map_err(|source| EmbeddedError::Command { command: program.to_owned(), source })?;
    let waited = tokio::select! {
        status = child.wait() => status,
        sig = signals.next() => {
            // A terminal's Ctrl-C reaches the whole process group, but `kill` reaches only us.
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = kill(Pid::from_raw(pid), sig);
            }
            match tokio::time::timeout(CHILD_GRACE, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    tracing::warn!(command = program, "command ignored the signal; killing it");
                    let _ = child.start_kill();
                    child.wait().await
                }
            }
        }
    };
    let status =
        waited.map_err(|source| EmbeddedError::Command { command: program.to_owned(), source })?;
    Ok(exit_code(status))
}

/// Latest termination signal received, shared by a listener task.
struct SignalWatch {
    rx: watch::Receiver<Option<Signal>>,
}

impl SignalWatch {
    fn install() -> Result<Self, EmbeddedError> {
        let mut interrupt = signal(SignalKind::interrupt()).map_err(EmbeddedError::Signals)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(EmbeddedError::Signals)?;
        let mut hangup = signal(SignalKind::hangup()).map_err(EmbeddedError::Signals)?;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            loop {
                let sig = tokio::select! {
                    Some(()) = interrupt.recv() => Signal::SIGINT,
                    Some(()) = terminate.recv() => Signal::SIGTERM,
                    Some(()) = hangup.recv() => Signal::SIGHUP,
                    else => break,
                };
                if tx.send(Some(sig)).is_err() {
                    break;
                }
            }
        });
        Ok(SignalWatch { rx })
    }

    fn received(&self) -> Option<Signal> {
        *self.rx.borrow()
    }

    /// Waits for a signal (returns at once if one already arrived).
    async fn next(&mut self) -> Signal {
        loop {
            if let Some(sig) = *self.rx.borrow_and_update() {
                return sig;
            }
            if self.rx.changed().await.is_err() {
                // The listener is gone; no signal will ever come.
                std::future::pending::<()>().await;
            }
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|sig| 128 + sig)).unwrap_or(1)
}

/// A data directory of its own for an ephemeral run without --data-dir.
fn fresh_ephemeral_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!("fairway-ephemeral-{}-{nanos:08x}", std::process::id()))
}

/// Creates `requested` for the server's user, falling back (as root) to a directory under
/// the temporary directory when the `postgres` user cannot reach it. Returns the directory
/// to use and the directories created for it, innermost first.
async fn prepare_data_dir(
    requested: &Path,
    run_as: Option<&RunAs>,
) -> Result<(PathBuf, Vec<PathBuf>), EmbeddedError> {
    let created = create_data_dir(requested, run_as)?;
    let Some(user) = run_as else {
        return Ok((requested.to_path_buf(), created));
    };
    if user_can_use_dir(user, requested).await? {
        return Ok((requested.to_path_buf(), created));
    }
    remove_empty_dirs(&created);
    let fallback = fallback_data_dir(&std::env::temp_dir(), requested);
    tracing::warn!(
        requested = %requested.display(),
        data_dir = %fallback.display(),
        "the {SYSTEM_USER} user cannot reach the requested data directory; using a fallback"
    );
    let created = create_data_dir(&fallback, run_as)?;
    if user_can_use_dir(user, &fallback).await? {
        Ok((fallback, created))
    } else {
        remove_empty_dirs(&created);
        Err(EmbeddedError::DataDirUnreachable { requested: requested.to_path_buf(), fallback })
    }
}

/// Creates the data directory (mode 700) and missing parents, and hands it to `run_as`.
/// Refuses a non-empty directory that is not a cluster before touching it.
fn create_data_dir(dir: &Path, run_as: Option<&RunAs>) -> Result<Vec<PathBuf>, EmbeddedError> {
    let io_error = |action, source| EmbeddedError::Io { action, path: dir.to_path_buf(), source };
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| io_error("read", e))?;
        if entries.next().is_some() && !dir.join("PG_VERSION").is_file() {
            return Err(EmbeddedError::NotACluster(dir.to_path_buf()));
        }
    }
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.exists() {
            break;
        }
        missing.push(path.to_path_buf());
        cursor = path.parent();
    }
    for path in missing.iter().rev() {
        let leaf = path == dir;
        std::fs::DirBuilder::new()
            .mode(if leaf { 0o700 } else { 0o755 })
            .create(path)
            .or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
            .map_err(|source| EmbeddedError::Io {
                action: "create directory",
                path: path.clone(),
                source,
            })?;
        if !leaf && run_as.is_some() {
            // A restrictive umask (077) would otherwise keep the postgres user out.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(
                |source| EmbeddedError::Io {
                    action: "set permissions of",
                    path: path.clone(),
                    source,
                },
            )?;
        }
    }
    chown_to(dir, run_as)?;
    Ok(missing)
}

/// Creates a directory owned by the server's user (socket directories).
fn create_owned_dir(dir: &Path, run_as: Option<&RunAs>) -> Result<(), EmbeddedError> {
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir).map_err(|source| {
        EmbeddedError::Io { action: "create directory", path: dir.to_path_buf(), source }
    })?;
    chown_to(dir, run_as)
}

fn chown_to(dir: &Path, run_as: Option<&RunAs>) -> Result<(), EmbeddedError> {
    let Some(user) = run_as else { return Ok(()) };
    let meta = std::fs::metadata(dir).map_err(|source| EmbeddedError::Io {
        action: "inspect",
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.uid() == user.uid.as_raw() && meta.gid() == user.gid.as_raw() {
        return Ok(());
    }
    std::os::unix::fs::chown(dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).map_err(
        |source| EmbeddedError::Io {
            action: "change the owner of",
            path: dir.to_path_buf(),
            source,
        },
    )
}

/// Asks the system itself, by running `test` as that user: permission bits, ACLs and every
/// ancestor's search permission all count, which no check of ours from root could mirror.
async fn user_can_use_dir(user: &RunAs, dir: &Path) -> Result<bool, EmbeddedError> {
    let mut command = tokio::process::Command::from(command_as(Path::new("/bin/sh"), Some(user)));
    command
        .args(["-c", r#"test -r "$1" && test -w "$1" && test -x "$1""#, "fairway-check"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = command.status().await.map_err(|source| EmbeddedError::Io {
        action: "check access as the postgres user to",
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(status.success())
}

/// Removes directories this run created, innermost first, as long as they are empty.
fn remove_empty_dirs(created: &[PathBuf]) {
    for dir in created {
        match std::fs::remove_dir(dir) {
            // Already gone (the data directory after remove_dir_all): go on to its parents.
            Err(error) if error.kind() != io::ErrorKind::NotFound => break,
            _ => {}
        }
    }
}

/// `$XDG_DATA_HOME/fairway/postgres`, else `$HOME/.local/share/fairway/postgres`; as root
/// `/var/lib/fairway/postgres`. A relative or empty XDG_DATA_HOME is ignored, as the XDG
/// specification asks.
fn default_data_dir(
    is_root: bool,
    xdg_data_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    if is_root {
        return Some(PathBuf::from("/var/lib/fairway/postgres"));
    }
    let base = xdg_data_home.map(PathBuf::from).filter(|dir| dir.is_absolute()).or_else(|| {
        home.filter(|home| !home.is_empty()).map(|home| PathBuf::from(home).join(".local/share"))
    })?;
    Some(base.join("fairway").join("postgres"))
}

/// `<temp>/fairway-<name of requested>-<hash of its path>`: recognisable, and distinct for
/// distinct requested directories so runs do not share a cluster by accident.
fn fallback_data_dir(temp_dir: &Path, requested: &Path) -> PathBuf {
    let name: String = requested
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "postgres".to_owned())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .take(40)
        .collect();
    temp_dir.join(format!("fairway-{name}-{:08x}", path_hash(requested)))
}

/// `<data_dir>/socket`, or `/tmp/fairway-<hash>` when the socket path would be too long.
fn socket_dir_for(data_dir: &Path, port: u16) -> PathBuf {
    let inside = data_dir.join(SOCKET_SUBDIR);
    if socket_path_len(&inside, port) < MAX_SOCKET_PATH {
        inside
    } else {
        // Literally /tmp, not $TMPDIR, which may itself be long.
        PathBuf::from(format!("/tmp/fairway-{:08x}", path_hash(data_dir)))
    }
}

fn socket_path_len(dir: &Path, port: u16) -> usize {
    dir.as_os_str().len() + format!("/.s.PGSQL.{port}").len()
}

/// FNV-1a, truncated: stable across Rust releases (unlike `DefaultHasher`), which matters
/// because kept clusters are found again by these names.
fn path_hash(path: &Path) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in path.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash ^ (hash >> 32)) as u32
}

/// Settings beyond the defaults, as a production server would have them. Durability stays at
/// the defaults (fsync, synchronous_commit on). The broker's fair-order tables are small and
/// rewritten on every claim, so autovacuum visits often; the default minute lets their indexes
/// fill with dead entries that every claim then steps over.
const SERVER_SETTINGS: &str = "-c max_connections=200 -c shared_buffers=512MB -c max_wal_size=2GB \
     -c autovacuum_naptime=10s";

/// The `-o` string for `pg_ctl start`. pg_ctl hands it to `/bin/sh`, hence the shell quoting;
/// the socket directory is also double-quoted because the setting is a comma-separated list.
fn server_options(socket_dir: &Path, port: u16, settings: &[(String, String)]) -> String {
    let socket_list = format!("\"{}\"", socket_dir.to_string_lossy().replace('"', "\"\""));
    let mut options = format!(
        "-c listen_addresses='' -c port={port} {SERVER_SETTINGS} -c unix_socket_directories={}",
        shell_quote(&socket_list)
    );
    for (name, value) in settings {
        options.push_str(&format!(" -c {name}={}", shell_quote(value)));
    }
    options
}

fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Quotes a value for a libpq key=value connection string when it needs it.
fn quote_conn_value(value: &str) -> String {
    if !value.is_empty() && !value.chars().any(|c| c.is_whitespace() || c == '\'' || c == '\\') {
        return value.to_owned();
    }
    format!("'{}'", value.replace('\\', r"\\").replace('\'', r"\'"))
}

/// Quotes an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Host (first socket directory, else first listen address) and port from `postmaster.pid`,
/// whose lines are: pid, data dir, start time, port, socket dir, listen address, ...
fn parse_postmaster_pid(text: &str) -> Option<(String, u16)> {
    let lines: Vec<&str> = text.lines().collect();
    let port = lines.get(3)?.trim().parse().ok()?;
    let socket_dir = lines.get(4).map(|line| line.trim()).unwrap_or("");
    let listen = lines.get(5).map(|line| line.trim()).unwrap_or("");
    let host = if !socket_dir.is_empty() {
        socket_dir.to_owned()
    } else {
        match listen.split(',').next().map(str::trim) {
            None | Some("") => return None,
            Some("*") => "localhost".to_owned(),
            Some(address) => address.to_owned(),
        }
    };
    Some((host, port))
}

/// The binaries directory: `pg_bin` if given, else the newest `/usr/lib/postgresql/<N>/bin`
/// (the cluster's own major version first, if installed), else the PATH.
fn discover_binaries(
    pg_bin: Option<&Path>,
    cluster_version: Option<&str>,
) -> Result<PathBuf, EmbeddedError> {
    if let Some(dir) = pg_bin {
        if has_tools(dir) {
            return Ok(dir.to_path_buf());
        }
        return Err(EmbeddedError::BinariesNotFound {
            searched: format!("--pg-bin {} has no executable initdb and pg_ctl", dir.display()),
        });
    }
    let versions = std::fs::read_dir(VERSIONED_ROOT)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if let Some(dir) =
        choose_versioned(Path::new(VERSIONED_ROOT), versions, cluster_version, has_tools)
    {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).find(|dir| dir.is_absolute() && has_tools(dir))
    }) {
        return Ok(dir);
    }
    Err(EmbeddedError::BinariesNotFound {
        searched: format!(
            "no {VERSIONED_ROOT}/<version>/bin with initdb, no initdb and pg_ctl on PATH"
        ),
    })
}

/// Picks `<root>/<version>/bin` among the version directory names: the cluster's version if
/// usable, else the newest usable one (versions compare numerically: 9.6 < 10 < 15).
fn choose_versioned(
    root: &Path,
    versions: Vec<String>,
    preferred: Option<&str>,
    usable: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let mut keyed: Vec<(Vec<u32>, String)> =
        versions.into_iter().filter_map(|name| Some((version_key(&name)?, name))).collect();
    keyed.sort_by(|a, b| b.0.cmp(&a.0));
    let bin = |name: &str| root.join(name).join("bin");
    if let Some(preferred) = preferred {
        if keyed.iter().any(|(_, name)| name == preferred) && usable(&bin(preferred)) {
            return Some(bin(preferred));
        }
    }
    keyed.into_iter().map(|(_, name)| bin(&name)).find(|dir| usable(dir))
}

fn version_key(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

fn has_tools(dir: &Path) -> bool {
    ["initdb", "pg_ctl"].iter().all(|tool| {
        std::fs::metadata(dir.join(tool))
            .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "unknown status".to_owned(),
    }
}

fn output_text(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    text
}

fn log_tail(log: &Path) -> String {
    match std::fs::read(log) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), TAIL_LINES),
        Err(error) => format!("(cannot read the log: {error})"),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn newest_usable_version_wins_numerically() {
        let root = Path::new("/usr/lib/postgresql");
        let names = ["9.6", "15", "10", "16", "notes"].map(String::from).to_vec();
        let all = |_: &Path| true;
        assert_eq!(choose_versioned(root, names.clone(), None, all), Some(root.join("16/bin")));
        let no_16 = |dir: &Path| !dir.starts_with("/usr/lib/postgresql/16");
        assert_eq!(choose_versioned(root, names.clone(), None, no_16), Some(root.join("15/bin")));
        assert_eq!(
            choose_versioned(root, names.clone(), Some("10"), all),
            Some(root.join("10/bin"))
        );
        // An uninstalled cluster version falls back to the newest.
        assert_eq!(choose_versioned(root, names, Some("14"), all), Some(root.join("16/bin")));
        assert_eq!(choose_versioned(root, vec!["x".into()], None, all), None);
    }

    #[test]
    fn default_data_dir_follows_xdg_then_home_and_root() {
        let xdg = Some(OsString::from("/xdg"));
        let home = Some(OsString::from("/home/u"));
        assert_eq!(
            default_data_dir(false, xdg, home.clone()),
            Some(PathBuf::from("/xdg/fairway/postgres"))
        );
        assert_eq!(
            default_data_dir(false, Some(OsString::from("relative")), home.clone()),
            Some(PathBuf::from("/home/u/.local/share/fairway/postgres"))
        );
        assert_eq!(default_data_dir(false, None, None), None);
        assert_eq!(
            default_data_dir(true, None, home),
            Some(PathBuf::from("/var/lib/fairway/postgres"))
        );
    }

    #[test]
    fn socket_dir_falls_back_when_path_too_long() {
        let short = Path::new("/srv/data");
        assert_eq!(socket_dir_for(short, 5432), short.join("socket"));
        let long = PathBuf::from(format!("/srv/{}", "d".repeat(90)));
        let fallback = socket_dir_for(&long, 5432);
        assert!(fallback.starts_with("/tmp"));
        assert!(socket_path_len(&fallback, 5432) < MAX_SOCKET_PATH);
        // Stable and distinct per data directory.
        assert_eq!(fallback, socket_dir_for(&long, 5432));
        assert_ne!(fallback, socket_dir_for(&long.join("x"), 5432));
    }

    #[test]
    fn fallback_data_dir_is_named_after_the_requested_one() {
        let dir = fallback_data_dir(Path::new("/tmp"), Path::new("/root/repo/target/pg test"));
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        assert!(name.starts_with("fairway-pg_test-"), "{name}");
        assert_eq!(dir.parent(), Some(Path::new("/tmp")));
        assert_ne!(dir, fallback_data_dir(Path::new("/tmp"), Path::new("/other/pg test")));
    }

    #[test]
    fn connection_string_parses_even_with_odd_names() {
        let server = EmbeddedPostgres {
            data_dir: PathBuf::from("/d"),
            host: "/path with space/it's".to_owned(),
            port: 5432,
            tools: Tools { bin_dir: PathBuf::new(), run_as: None },
            started_by_us: false,
            ephemeral: false,
            created_dirs: Vec::new(),
            external_socket_dir: None,
            settings: Vec::new(),
            killed: false,
            stopped: true,
        };
        let text = server.connection_string(r"we\ird db");
        let config = tokio_postgres::Config::from_str(&text).map_err(|e| e.to_string());
        let config = match config {
            Ok(config) => config,
            Err(error) => panic!("{text}: {error}"),
        };
        assert_eq!(config.get_dbname(), Some(r"we\ird db"));
        assert_eq!(config.get_user(), Some("postgres"));
        assert_eq!(config.get_ports(), &[5432]);
        assert_eq!(
            config.get_hosts(),
            &[tokio_postgres::config::Host::Unix(PathBuf::from("/path with space/it's"))]
        );
        assert_eq!(
            server.connection_string("fairway"),
            "host=/path with space/it's port=5432 user=postgres dbname=fairway"
                .replace("/path with space/it's", r"'/path with space/it\'s'")
        );
    }

    #[test]
    fn postmaster_pid_gives_socket_dir_and_port() {
        let text = "123\n/data\n1700000000\n5433\n/data/socket\n\n  1234 5\nready   \n";
        assert_eq!(parse_postmaster_pid(text), Some(("/data/socket".to_owned(), 5433)));
        let tcp = "123\n/data\n1700000000\n5432\n\n*\n";
        assert_eq!(parse_postmaster_pid(tcp), Some(("localhost".to_owned(), 5432)));
        assert_eq!(parse_postmaster_pid("123\n/data\n"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(quote_ident(r#"a"b"#), r#""a""b""#);
        assert_eq!(
            server_options(Path::new("/d/socket"), 5432, &[]),
            format!(
                r#"-c listen_addresses='' -c port=5432 {SERVER_SETTINGS} -c unix_socket_directories='"/d/socket"'"#
            )
        );
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
