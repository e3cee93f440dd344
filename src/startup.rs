//! Assembles the broker: database pool and migrations, background tasks, HTTP server.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use deadpool_postgres::Pool;
use thiserror::Error;
use tokio::task::JoinHandle;

use crate::broker::{Broker, BrokerSettings, WorkSignals};
use crate::config::{PruneArgs, ServeArgs};
use crate::db::{self, DbError};
use crate::metrics::Metrics;

/// Expired leases examined per reaper pass.
const REAP_BATCH: i64 = 500;

/// How often the queue waits of claimed items are read.
const QUEUE_WAIT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum StartupError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error("cannot set up the metrics: {0}")]
    Metrics(String),
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
}

/// A broker bound to its port, ready to run.
pub struct Application {
    server: Server,
    port: u16,
    broker: Broker,
    background: Vec<JoinHandle<()>>,
}

impl Application {
    /// Connects to the database, applies migrations and binds the HTTP listener.
    pub async fn build(
        args: &ServeArgs,
        config: tokio_postgres::Config,
    ) -> Result<Self, StartupError> {
        let pool = db::pool::connect(config.clone(), args.database.pool_size)?;
        db::migrations::run(&pool).await?;

        let signals = WorkSignals::default();
        let broker = broker(pool, args, signals.clone())?;
        let mut background = maintain(&broker, args);
        background.push(tokio::spawn(db::listener::listen_for_work(config, signals)));

        let listener = TcpListener::bind(args.bind)
            .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })?
            .port();
        let data = web::Data::new(broker.clone());
        let max_body_bytes = args.max_body_bytes;
        let server = HttpServer::new(move || {
            App::new()
                .wrap(request_log())
                .wrap(actix_web::middleware::from_fn(crate::http::observe))
                .app_data(data.clone())
                .configure(crate::http::configure(max_body_bytes))
                .default_service(web::to(crate::http::no_such_route))
        })
        .listen(listener)
        .map_err(|source| StartupError::Bind { address: args.bind.to_string(), source })?
        .run();
        Ok(Self { server, port, broker, background })
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

    /// Serves until the server is stopped (SIGINT or SIGTERM), then stops background tasks.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        for task in self.background {
            task.abort();
        }
        result
    }
}

fn request_log() -> actix_web::middleware::Logger {
    actix_web::middleware::Logger::new("%r %s %Dms")
}

/// The broker `serve` runs, with its settings and metrics from `args`.
pub fn broker(pool: Pool, args: &ServeArgs, signals: WorkSignals) -> Result<Broker, StartupError> {
    let settings = BrokerSettings {
        lease: args.lease,
        max_retries: args.max_retries,
        querier_forget_delay: args.querier_forget_delay,
        batch_lanes: args.batches.batch_lanes.into(),
        batch_max: args.batches.batch_max.into(),
        long_poll_max: args.long_poll_max,
    };
    let metrics = Metrics::new(args.metrics.metrics_refresh, args.metrics.metrics_tenant_label)
        .map_err(|error| StartupError::Metrics(error.to_string()))?;
    Ok(Broker::new(pool, settings, signals, Arc::new(metrics)))
}

/// The broker's upkeep, as `serve` runs it beside the HTTP server: the reaper, the queue waits
/// of claimed items for /metrics, the vacuum of the fair order's tables unless
/// `--vacuum-interval` is zero, and the pruner unless `--retention` is zero.
pub fn maintain(broker: &Broker, args: &ServeArgs) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(reap(broker.clone(), args.reap_interval)),
        tokio::spawn(record_queue_waits(broker.clone())),
    ];
    if !args.vacuum.vacuum_interval.is_zero() {
        tasks.push(tokio::spawn(vacuum(broker.clone(), args.vacuum.vacuum_interval)));
    }
    if !args.prune.retention.is_zero() {
        tasks.push(tokio::spawn(prune(broker.clone(), args.prune)));
    }
    tasks
}

/// On a fixed cadence: expires leases, retires and forgets queriers, and tidies the tenant
/// level of the fair order. Several brokers may run this at once.
async fn reap(broker: Broker, interval: std::time::Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match broker.reap_expired_leases(REAP_BATCH).await {
            Ok(0) => {}
            Ok(reaped) => tracing::info!(reaped, "expired leases returned to the queue"),
            Err(error) => tracing::warn!(%error, "lease reaper pass failed"),
        }
        if let Err(error) = broker.retire_queriers().await {
            tracing::warn!(%error, "querier membership pass failed");
        }
        if let Err(error) = broker.tidy_tenant_queues().await {
            tracing::warn!(%error, "tenant queue pass failed");
        }
    }
}

/// Deletes the jobs past their retention, every --prune-interval; the batches log what they
/// deleted.
async fn prune(broker: Broker, args: PruneArgs) {
    let mut ticker = tokio::time::interval(args.prune_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = broker.prune_finished_jobs(args.retention).await {
            tracing::warn!(%error, "pruning finished jobs failed");
        }
    }
}

/// Reads, once a second, when the items claimed meanwhile were created: off the claim path, so
/// that measuring a claim's queue wait adds nothing to the claim.
async fn record_queue_waits(broker: Broker) {
    let mut ticker = tokio::time::interval(QUEUE_WAIT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = broker.record_queue_waits().await {
            tracing::warn!(%error, "reading claimed items' queue waits failed");
        }
    }
}

async fn vacuum(broker: Broker, interval: std::time::Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = broker.vacuum_fair_order().await {
            tracing::warn!(%error, "vacuum of the fair order's tables failed");
        }
    }
}
