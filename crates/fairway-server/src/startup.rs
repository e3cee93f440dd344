//! Assembles the broker: database pool and migrations, background tasks, HTTP server.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use deadpool_postgres::Pool;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::AuthState;
use crate::config::{PruneArgs, ServeArgs};
use crate::tls::{ServerCertificate, TlsError};
use crate::Traffic;
use fairway_broker::auth::{self, Authenticator};
use fairway_broker::db::{self, DbError};
use fairway_broker::metrics::Metrics;
use fairway_broker::{
    AskFlusher, Broker, BrokerError, BrokerSettings, FunctionSetMarker, FunctionSetPruner,
    MaintenanceLeader, Promoter, Pruner, QueueWaitReader, Reaper, Resharder, Running,
    StrategyRunningFolder, Upkeeps, Vacuum, WorkSignals,
};
use fairway_pg::Database;

/// Binds the HTTP listener on `args.bind`.
pub fn bind(args: &ServeArgs) -> Result<TcpListener, StartupError> {
    TcpListener::bind(args.bind)
        .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })
}

#[derive(Debug, Error)]
pub enum StartupError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot set up the metrics: {0}")]
    Metrics(String),
    #[error("cannot listen on {address}: {source}{}", bind_hint(source))]
    Bind { address: String, source: std::io::Error },
    #[error("cannot set up auth: {0}")]
    Auth(#[from] BrokerError),
    /// Auth is off and the address is not loopback: refused without --insecure-no-auth.
    #[error(
        "refusing to serve {address} without auth: anyone who reaches it could do anything. \
         Set FAIRWAY_ADMIN_TOKEN (docs/security.md), bind a loopback address, or pass \
         --insecure-no-auth to accept the risk"
    )]
    NoAuth { address: String },
    #[error("{0}")]
    AdminToken(String),
}

/// What to do about a listener that could not be bound.
fn bind_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process holds the port: stop it, or choose another address with --bind \
             or FAIRWAY_BIND)"
        }
        std::io::ErrorKind::AddrNotAvailable | std::io::ErrorKind::PermissionDenied => {
            " (choose another address with --bind or FAIRWAY_BIND)"
        }
        _ => "",
    }
}

/// A broker bound to its port, ready to run.
pub struct Application {
    server: Server,
    port: u16,
    broker: Broker,
    traffic: web::Data<Traffic>,
    shutdown_timeout: Duration,
    upkeep: Maintained,
    background: Vec<JoinHandle<()>>,
}

impl Application {
    /// Binds the HTTP listener, connects to the database and applies migrations.
    pub async fn build(args: &ServeArgs, database: Database) -> Result<Self, StartupError> {
        Self::build_on(bind(args)?, args, database).await
    }

    /// As [`Application::build`], on a listener already bound to `args.bind` (by [`bind`]),
    /// so that a taken port is reported before anything touches the database.
    pub async fn build_on(
        listener: TcpListener,
        args: &ServeArgs,
        database: Database,
    ) -> Result<Self, StartupError> {
        // The certificate first: a bad path is reported before anything reaches the database.
        let certificate = ServerCertificate::load(&args.tls)?;
        let pool = db::pool::connect(&database, args.pool.pool_size)?;
        // Every reason to refuse the start is found before the migrations change anything.
        check_auth(&pool, args).await?;
        db::migrations::run(&pool).await?;
        let authenticator = authenticate(&pool, args).await?;

        let signals = WorkSignals::default();
        let broker = broker(pool, args, signals.clone())?;
        let upkeep = maintain(&broker, &database, args, Some(authenticator.clone()));
        let mut background =
            vec![tokio::spawn(fairway_broker::listener::listen_for_work(database, signals))];
        background.push(tokio::spawn(watch_database(broker.clone())));

        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })?
            .port();
        let data = web::Data::new(broker.clone());
        let traffic = web::Data::new(Traffic::default());
        let auth_state = web::Data::new(AuthState {
            authenticator,
            metrics_require_token: args.auth.metrics_require_token,
        });
        let shared_traffic = traffic.clone();
        let prestop_delay = web::Data::new(crate::admin::PrestopDelay(args.prestop_delay));
        let max_body_bytes = args.max_body_bytes;
        let server = HttpServer::new(move || {
            App::new()
                // The last wrapped runs first: every answer, a refusal too, is observed.
                .wrap(actix_web::middleware::from_fn(crate::auth::authorize))
                .wrap(actix_web::middleware::from_fn(crate::observe))
                .app_data(data.clone())
                .app_data(auth_state.clone())
                .app_data(shared_traffic.clone())
                .app_data(prestop_delay.clone())
                .configure(crate::configure(max_body_bytes))
                .default_service(web::to(crate::no_such_route))
        })
        // The broker handles the signals itself, to drain before the listener closes.
        .disable_signals()
        // A client that closes its connection (a worker gone in the middle of a long poll)
        // ends its request at once: its handler is dropped, so that it claims nothing for no
        // one (see Endings::release_unanswered). No HTTP client this broker serves half-closes
        // a connection to wait for an answer.
        .h1_allow_half_closed(false)
        .shutdown_timeout(args.shutdown_timeout.as_secs());
        let bound = match &certificate {
            Some(certificate) => {
                background.push(tokio::spawn(certificate.clone().watch()));
                server.listen_rustls_0_23(listener, certificate.server_config()?)
            }
            None => server.listen(listener),
        };
        let server = bound
            .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })?
            .run();
        let shutdown_timeout = args.shutdown_timeout;
        Ok(Self { server, port, broker, traffic, shutdown_timeout, upkeep, background })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from elsewhere (the benchmark runs several in one process).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Serves until the server is stopped, by its handle or by SIGTERM or SIGINT, then stops
    /// the upkeeps, each after the pass it is in, and the other background tasks. A signal
    /// drains the broker first (see `stop_gracefully`).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Self { server, broker, traffic, shutdown_timeout, upkeep, background, .. } = self;
        let handle = server.handle();
        let mut serving = tokio::spawn(server);
        let served = tokio::select! {
            served = &mut serving => served,
            signal = termination() => {
                let deadline = Instant::now() + shutdown_timeout;
                tracing::info!(signal = signal?, timeout = ?shutdown_timeout, "stopping");
                stop_gracefully(&broker, &traffic, &handle, deadline).await;
                serving.await
            }
        };
        upkeep.stop().await;
        for task in background {
            task.abort();
        }
        served.map_err(std::io::Error::other)?
    }
}

/// Refuses to serve a non-loopback address without auth unless told to (then warns, at every
/// start), before anything changes the database: auth is on with FAIRWAY_ADMIN_TOKEN, or with a
/// token the database already holds, which is only read. Checks the admin token too.
async fn check_auth(pool: &Pool, args: &ServeArgs) -> Result<(), StartupError> {
    let admin_token = admin_token(args);
    if let Some(token) = admin_token {
        auth::check_admin_token(token).map_err(StartupError::AdminToken)?;
    }
    let address = args.bind.to_string();
    if admin_token.is_some() {
        return Ok(());
    }
    let stored = auth::tokens_stored(pool).await?;
    if stored || args.bind.ip().is_loopback() {
        return Ok(());
    }
    if !args.auth.insecure_no_auth {
        return Err(StartupError::NoAuth { address });
    }
    tracing::warn!(
        address,
        "auth is off on a non-loopback address (--insecure-no-auth): anyone who reaches the \
         port may submit, claim, read every job and change tenant limits"
    );
    Ok(())
}

/// FAIRWAY_ADMIN_TOKEN, unless unset or empty.
fn admin_token(args: &ServeArgs) -> Option<&str> {
    args.auth.admin_token.as_deref().filter(|token| !token.is_empty())
}

/// Stores FAIRWAY_ADMIN_TOKEN's hash and starts the token cache, once the schema is in place.
async fn authenticate(pool: &Pool, args: &ServeArgs) -> Result<Authenticator, StartupError> {
    let authenticator =
        Authenticator::start(pool.clone(), args.auth.auth_cache_ttl, admin_token(args)).await?;
    if authenticator.is_on() {
        tracing::info!("auth is on: every request but the probes needs a bearer token");
    } else if args.bind.ip().is_loopback() {
        tracing::info!(
            address = args.bind.to_string(),
            "auth is off (no FAIRWAY_ADMIN_TOKEN and no token in the database): serving on \
             loopback only"
        );
    }
    Ok(authenticator)
}

/// How often a stopping broker looks whether its requests in flight have ended.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(5);

/// Stops handing out work at once (/readyz answers 503, waiting long polls and new claims 503
/// with Retry-After, every answer closes its connection), waits for the requests in flight to
/// end, the claims and reports among them, until `deadline` at the latest, then closes the
/// listener and every connection. Idle keep-alive connections are not waited for: a worker's
/// next request, refused a connection, goes to another broker, and a report cut off is sent
/// again there (attempts make it safe).
async fn stop_gracefully(
    broker: &Broker,
    traffic: &Traffic,
    handle: &actix_web::dev::ServerHandle,
    deadline: Instant,
) {
    broker.drain();
    while traffic.in_flight() > 0 {
        if Instant::now() >= deadline {
            tracing::warn!(
                in_flight = traffic.in_flight(),
                "requests still in flight at the shutdown timeout; cutting them off"
            );
            break;
        }
        tokio::time::sleep(IN_FLIGHT_POLL).await;
    }
    tracing::info!("drained; closing the listener");
    handle.stop(false).await;
}

/// The name of the first SIGTERM or SIGINT.
async fn termination() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    })
}

/// The broker `serve` runs, with its settings and metrics from `args`.
pub fn broker(pool: Pool, args: &ServeArgs, signals: WorkSignals) -> Result<Broker, StartupError> {
    let settings = BrokerSettings {
        lease: args.lease,
        first_lease: args.first_lease,
        max_retries: args.max_retries,
        querier_forget_delay: args.querier_forget_delay,
        claim_lanes: args.batches.claim_lanes.into(),
        ending_lanes: args.batches.ending_lanes.into(),
        batch_max: args.batches.batch_max.into(),
        long_poll_max: args.long_poll_max,
        idempotency_ttl: args.idempotency_ttl,
        retry_defaults: args.retry.defaults(args.max_retries),
    };
    let metrics = Metrics::new(args.metrics.metrics_refresh, args.metrics.metrics_tenant_label)
        .map_err(|error| StartupError::Metrics(error.to_string()))?;
    Ok(Broker::new(pool, settings, signals, Arc::new(metrics)))
}

/// The broker's upkeep, as `serve` runs it beside the HTTP server: what each broker does for
/// itself (the asks for work it saw, its queue waits, its token cache, marking its server
/// functions as in use) on every broker, and the upkeeps that work on the whole database on the
/// maintenance leader only: the reaper, the resharder, the strategies' fold, the promoter, the
/// pruning of unused server functions, the vacuum unless `--vacuum-interval` is
/// zero, and the pruner unless `--retention` is zero.
pub fn maintain(
    broker: &Broker,
    database: &Database,
    args: &ServeArgs,
    authenticator: Option<Authenticator>,
) -> Maintained {
    let metrics = broker.metrics().clone();
    let maintenance = broker.maintenance();
    let mut own = Upkeeps::new(metrics.clone())
        .with(AskFlusher::new(maintenance))
        .with(QueueWaitReader::new(maintenance))
        .with(FunctionSetMarker::new(maintenance, args.function_set_retention));
    if let Some(authenticator) = authenticator {
        own = own.with(authenticator);
    }
    let mut shared = Upkeeps::new(metrics.clone())
        .with(Reaper::new(maintenance, args.reap_interval))
        .with(Resharder::new(broker.tenancy(), args.reap_interval))
        .with(StrategyRunningFolder::new(maintenance, args.reap_interval))
        .with(Promoter::new(maintenance, args.retry.promote_interval))
        .with(FunctionSetPruner::new(maintenance, args.function_set_retention));
    if !args.vacuum.vacuum_interval.is_zero() {
        shared = shared.with(Vacuum::new(maintenance, args.vacuum.vacuum_interval));
    }
    if !args.prune.retention.is_zero() {
        let PruneArgs { retention, prune_interval } = args.prune;
        shared = shared.with(Pruner::new(maintenance, retention, prune_interval));
    }
    let (stop_leading, stopped) = watch::channel(false);
    let leader = MaintenanceLeader::new(database.clone(), shared, metrics).spawn(stopped);
    Maintained { own: own.start(), stop_leading, leader }
}

/// The upkeeps [`maintain`] started.
pub struct Maintained {
    own: Running,
    stop_leading: watch::Sender<bool>,
    leader: JoinHandle<()>,
}

impl Maintained {
    /// Stops every upkeep after the pass it is in, and gives up the leadership if held.
    pub async fn stop(self) {
        self.stop_leading.send_replace(true);
        if let Err(error) = self.leader.await {
            tracing::warn!(%error, "the maintenance leader's task ended abnormally");
        }
        self.own.stop().await;
    }
}

/// How often the broker looks at which database server its pool reaches.
const DATABASE_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What the broker's pool reaches, as the log reports it.
#[derive(PartialEq)]
enum DatabaseState {
    Reached { host: String, writable: bool },
    Unreachable,
}

/// Logs, once per change, which database server the pool reaches and whether it takes
/// writes: an operator reads a failover in the log as unreachable, then the new primary.
async fn watch_database(broker: Broker) {
    let mut ticker = tokio::time::interval(DATABASE_WATCH_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        ticker.tick().await;
        let (state, error) = match broker.database_state().await {
            // A broker that started on a standby left the schema alone, and the primary it
            // reaches after a failover may not hold this build's functions.
            Ok(row) if !row.in_recovery && !row.functions_installed => {
                if let Err(error) = broker.install_schema().await {
                    tracing::warn!(%error, "installing this build's server functions failed");
                }
                (DatabaseState::Reached { host: row.host, writable: true }, None)
            }
            Ok(row) => {
                (DatabaseState::Reached { host: row.host, writable: !row.in_recovery }, None)
            }
            Err(error) => (DatabaseState::Unreachable, Some(error)),
        };
        if last.as_ref() == Some(&state) {
            continue;
        }
        match (&state, error) {
            // A primary at start-up is the healthy case; after a failover, news.
            (DatabaseState::Reached { host, writable: true }, _) if last.is_none() => {
                tracing::info!(host, writable = true, "database server reached: a primary")
            }
            (DatabaseState::Reached { host, writable: true }, _) => {
                tracing::warn!(host, writable = true, "database server reached: a primary")
            }
            (DatabaseState::Reached { host, writable: false }, _) => tracing::warn!(
                host,
                writable = false,
                "database server reached is a standby in recovery: not ready, writes answer 503"
            ),
            (DatabaseState::Unreachable, error) => tracing::warn!(
                error = error.map(|error| error.to_string()),
                "database unreachable: not ready, requests answer 503"
            ),
        }
        last = Some(state);
    }
}
