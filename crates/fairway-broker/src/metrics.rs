//! The broker's Prometheus metrics, served at `GET /metrics` in the text exposition format.
//!
//! Counters and histograms move as requests are served. The gauges that describe the queues come
//! from the database (`maintenance/refresh_metrics.sql`), at most once per `--metrics-refresh`, and
//! are set just before each scrape is encoded. No label ever carries a user, job or item id;
//! `tenant` is a label only with `--metrics-tenant-label`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use fairway_api::summary::ServiceSummary;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use serde::Deserialize;

/// Claimed first attempts whose queue wait is still to be read; past this, claims go unmeasured
/// until the next pass has read them (a sample, rather than memory without bound).
const MOST_PENDING_WAITS: usize = 10_000;

/// The item states `fairway_work_items` reports.
const STATES: [&str; 4] = ["ready", "running", "paused", "scheduled"];

/// How a claim request ended, for `fairway_claims_total`.
#[derive(Debug, Clone, Copy)]
pub enum ClaimOutcome {
    Item,
    Empty,
}

/// How an attempt ended, for `fairway_work_items_finished_total`.
#[derive(Debug, Clone, Copy)]
pub enum Finish {
    Successful,
    Failed,
    Retried,
    Canceled,
}

impl Finish {
    fn as_str(self) -> &'static str {
        match self {
            Self::Successful => "successful",
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Canceled => "canceled",
        }
    }
}

/// The two kinds of group-commit batch, for `fairway_batch_size`.
#[derive(Debug, Clone, Copy)]
pub enum BatchKind {
    Claim,
    Ending,
}

/// What became of a worker's report whose owner's row another transaction held, for
/// `fairway_ending_deferrals_total`.
#[derive(Debug, Clone, Copy)]
pub enum Deferral {
    /// It goes again with a later batch.
    SentAgain,
    /// Deferred too often, it waits for the row in a transaction of its own.
    Waited,
}

/// One row of the database's gauges, as `maintenance/refresh_metrics.sql` stores them.
#[derive(Debug, Clone, Deserialize)]
pub struct GaugeRow {
    pub service: String,
    /// None: summed over every tenant (active users only).
    pub tenant: Option<String>,
    pub measure: String,
    pub value: f64,
}

/// A first attempt that was claimed, waiting for its creation time to be read.
#[derive(Debug, Clone)]
pub struct ClaimedItem {
    pub id: i64,
    pub service: String,
    pub tenant: String,
    pub claimed_at: DateTime<Utc>,
}

/// Connection counts of the database pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolConnections {
    pub in_use: usize,
    pub idle: usize,
    pub max: usize,
}

/// When the database's gauges were last taken, and the series they have shown since start.
struct Snapshot {
    taken: Option<Instant>,
    rows: Vec<GaugeRow>,
    /// (service, tenant) of every series shown so far: one that empties reports 0 rather than
    /// vanish, so that alerts and autoscalers see the queue drain.
    seen: BTreeSet<(String, Option<String>)>,
    /// This broker's claims that got items, per service, when the gauges were taken, and the
    /// rate since the time before.
    claims: BTreeMap<String, u64>,
    claims_per_second: BTreeMap<String, f64>,
    /// When workers last asked for each service, in any broker, when the gauges were taken.
    asked: BTreeMap<String, DateTime<Utc>>,
}

pub struct Metrics {
    registry: Registry,
    tenant_label: bool,
    refresh: Duration,
    claims: IntCounterVec,
    finished: IntCounterVec,
    lease_expirations: IntCounterVec,
    pruned: IntCounterVec,
    transaction_retries: IntCounterVec,
    transaction_retries_exhausted: IntCounterVec,
    claims_released: IntCounterVec,
    items_released: IntCounterVec,
    passed_over: IntCounterVec,
    ending_deferrals: IntCounterVec,
    claim_duration: Histogram,
    queue_wait: HistogramVec,
    batch_size: HistogramVec,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    work_items: GaugeVec,
    oldest_ready_age: GaugeVec,
    active_users: GaugeVec,
    held_back: GaugeVec,
    last_asked: GaugeVec,
    waiting_workers: IntGaugeVec,
    pool_connections: IntGaugeVec,
    pool_max: IntGauge,
    maintenance_leader: IntGauge,
    upkeep_passes: IntCounterVec,
    snapshot: tokio::sync::Mutex<Snapshot>,
    pending_waits: Mutex<Vec<ClaimedItem>>,
}

impl Metrics {
    /// `refresh`: how old the database's gauges may be; `tenant_label`: whether the per-queue
    /// metrics carry a `tenant` label.
    pub fn new(refresh: Duration, tenant_label: bool) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let tenant = |labels: &[&'static str]| -> Vec<&'static str> {
            let mut all = vec![labels[0]];
            if tenant_label {
                all.push("tenant");
            }
            all.extend(&labels[1..]);
            all
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let counter = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(counter.clone()))?;
            Ok::<_, prometheus::Error>(counter)
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let gauge = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok::<_, prometheus::Error>(gauge)
        };
        let int_gauge = |name: &str, help: &str, labels: &[&str]| {
            let gauge = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok::<_, prometheus::Error>(gauge)
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]| {
            let histogram =
                HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
            registry.register(Box::new(histogram.clone()))?;
            Ok::<_, prometheus::Error>(histogram)
        };
        let claim_duration = Histogram::with_opts(
            HistogramOpts::new(
                "fairway_claim_duration_seconds",
                "Time of one claim transaction (a group-commit batch of claims), in seconds.",
            )
            .buckets(prometheus::exponential_buckets(0.000_25, 2.0, 14)?),
        )?;
        registry.register(Box::new(claim_duration.clone()))?;
        let pool_max = IntGauge::new(
            "fairway_db_pool_max_connections",
            "Most connections this broker's database pool opens (--pool-size).",
        )?;
        registry.register(Box::new(pool_max.clone()))?;
        let maintenance_leader = IntGauge::new(
            "fairway_maintenance_leader",
            "1 while this broker is the maintenance leader, the one broker that runs the \
             shared upkeeps (reaper, promoter, pruner, vacuum, resharder); 0 otherwise.",
        )?;
        registry.register(Box::new(maintenance_leader.clone()))?;
        let build_info = int_gauge(
            "fairway_build_info",
            "Always 1; the broker's release, the revision of the server functions it carries \
             and its last schema migration are in the labels.",
            &["version", "functions_revision", "schema_migration"],
        )?;
        let revision = crate::db::functions::REVISION.to_string();
        let migration = crate::db::migrations::latest();
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), &revision, &migration]).set(1);
        Ok(Self {
            claims: counter(
                "fairway_claims_total",
                "Claim requests answered, by whether they got at least one item.",
                &["service", "outcome"],
            )?,
            finished: counter(
                "fairway_work_items_finished_total",
                "Attempts ended: successful, failed for good, retried (back in the queue), \
                 or canceled.",
                &tenant(&["service", "status"]),
            )?,
            lease_expirations: counter(
                "fairway_lease_expirations_total",
                "Leases that expired without a report, ended by this broker's reaper.",
                &["service"],
            )?,
            pruned: counter(
                "fairway_pruned_total",
                "Rows the pruner deleted, of finished jobs past --retention: jobs and items.",
                &["kind"],
            )?,
            transaction_retries: counter(
                "fairway_transaction_retries_total",
                "Transactions run again after PostgreSQL aborted them for a deadlock (sqlstate \
                 40P01) or a serialization failure (40001), by operation.",
                &["operation", "sqlstate"],
            )?,
            transaction_retries_exhausted: counter(
                "fairway_transaction_retries_exhausted_total",
                "Transactions given up after every run was aborted so; each answered 503.",
                &["operation", "sqlstate"],
            )?,
            claims_released: counter(
                "fairway_claims_released_total",
                "Items claimed for a long poll whose client had gone before the answer, put \
                 back at once without counting an attempt.",
                &["service"],
            )?,
            items_released: counter(
                "fairway_items_released_total",
                "Items workers handed back unworked (status released): ready again at once, \
                 the attempt not counted against the retry budget.",
                &["service"],
            )?,
            passed_over: counter(
                "fairway_claims_passed_over_total",
                "Claims that came back empty because a policy held them back: a service's, or \
                 that of every user or tenant with work, at its cap on running items (cap) or \
                 out of its rate limit (rate).",
                &["reason"],
            )?,
            ending_deferrals: counter(
                "fairway_ending_deferrals_total",
                "Worker reports that found their owner's row held by another transaction (a \
                 claim batch, mostly): then sent again with a later batch, or, after 10 such, \
                 waiting for the row alone.",
                &["then"],
            )?,
            claim_duration,
            queue_wait: histogram(
                "fairway_queue_wait_seconds",
                "Time an item's first attempt waited from its creation until claimed, in \
                 seconds.",
                prometheus::exponential_buckets(0.01, 4.0, 10)?,
                &tenant(&["service"]),
            )?,
            batch_size: histogram(
                "fairway_batch_size",
                "Requests per group-commit transaction, by kind: claim or ending.",
                prometheus::exponential_buckets(1.0, 2.0, 8)?,
                &["kind"],
            )?,
            http_requests: counter(
                "fairway_http_requests_total",
                "HTTP requests answered, by route pattern and status code.",
                &["route", "code"],
            )?,
            http_duration: histogram(
                "fairway_http_request_duration_seconds",
                "Time to answer an HTTP request, by route pattern, in seconds (long polls \
                 included).",
                prometheus::exponential_buckets(0.000_5, 4.0, 10)?,
                &["route"],
            )?,
            work_items: gauge(
                "fairway_work_items",
                "Work items by state: ready (claimable), running (leased), paused (ready in a \
                 paused job), scheduled (waiting for their not_before time).",
                &tenant(&["service", "state"]),
            )?,
            oldest_ready_age: gauge(
                "fairway_oldest_ready_age_seconds",
                "Age of the oldest ready item since it was created, in seconds; 0 when none.",
                &tenant(&["service"]),
            )?,
            active_users: gauge(
                "fairway_active_users",
                "Users with ready or running items.",
                &tenant(&["service"]),
            )?,
            held_back: gauge(
                "fairway_held_back_keys",
                "Users and tenants with work for the service that claims pass over now: kind \
                 user or tenant, reason cap (at max_running) or rate (bucket empty).",
                &["service", "kind", "reason"],
            )?,
            last_asked: gauge(
                "fairway_service_last_asked_timestamp_seconds",
                "When a worker last asked any broker for the service's work, as a Unix time; \
                 written every few seconds. Ready work and an old time: no worker serves it.",
                &["service"],
            )?,
            waiting_workers: int_gauge(
                "fairway_waiting_workers",
                "Workers long-polling this broker for work.",
                &["service"],
            )?,
            pool_connections: int_gauge(
                "fairway_db_pool_connections",
                "Connections of this broker's database pool: in_use or idle.",
                &["state"],
            )?,
            pool_max,
            maintenance_leader,
            upkeep_passes: counter(
                "fairway_upkeep_passes_total",
                "Passes of each background upkeep this broker ran, failed ones included; the \
                 shared upkeeps run only on the maintenance leader.",
                &["upkeep"],
            )?,
            registry,
            tenant_label,
            refresh,
            snapshot: tokio::sync::Mutex::new(Snapshot {
                taken: None,
                rows: Vec::new(),
                seen: BTreeSet::new(),
                claims: BTreeMap::new(),
                claims_per_second: BTreeMap::new(),
                asked: BTreeMap::new(),
            }),
            pending_waits: Mutex::new(Vec::new()),
        })
    }

    pub fn refresh(&self) -> Duration {
        self.refresh
    }

    pub fn claim_answered(&self, service: &str, outcome: ClaimOutcome) {
        let outcome = match outcome {
            ClaimOutcome::Item => "item",
            ClaimOutcome::Empty => "empty",
        };
        self.claims.with_label_values(&[service, outcome]).inc();
    }

    pub fn finished(&self, service: &str, tenant: &str, finish: Finish, count: u64) {
        let labels = self.with_tenant(service, tenant, &[finish.as_str()]);
        self.finished.with_label_values(&labels).inc_by(count);
    }

    /// Whether this broker holds the maintenance leadership.
    pub fn set_maintenance_leader(&self, leader: bool) {
        self.maintenance_leader.set(i64::from(leader));
    }

    /// The count of `upkeep`'s passes, for the loop that runs them.
    pub fn upkeep_passes(&self, upkeep: &str) -> prometheus::IntCounter {
        self.upkeep_passes.with_label_values(&[upkeep])
    }

    pub fn lease_expired(&self, service: &str) {
        self.lease_expirations.with_label_values(&[service]).inc();
    }

    /// A pruning transaction deleted `jobs` jobs and `items` items.
    pub fn pruned(&self, jobs: u64, items: u64) {
        self.pruned.with_label_values(&["jobs"]).inc_by(jobs);
        self.pruned.with_label_values(&["items"]).inc_by(items);
    }

    /// A transaction of `operation` failed with `sqlstate` and runs again.
    pub fn transaction_retried(&self, operation: &str, sqlstate: &str) {
        self.transaction_retries.with_label_values(&[operation, sqlstate]).inc();
    }

    /// A transaction of `operation` kept failing with `sqlstate` and was given up.
    pub fn transaction_retries_exhausted(&self, operation: &str, sqlstate: &str) {
        self.transaction_retries_exhausted.with_label_values(&[operation, sqlstate]).inc();
    }

    /// An item claimed for a client that had gone went back to ready.
    pub fn claim_released(&self, service: &str) {
        self.claims_released.with_label_values(&[service]).inc();
    }

    /// A worker handed an item back unworked.
    pub fn item_released(&self, service: &str) {
        self.items_released.with_label_values(&[service]).inc();
    }

    /// A claim was held back by its service's policy: `cap` or `rate`.
    pub fn passed_over(&self, reason: &str) {
        self.passed_over.with_label_values(&[reason]).inc();
    }

    /// A worker's report found its owner's row held.
    pub fn ending_deferred(&self, deferral: Deferral) {
        let then = match deferral {
            Deferral::SentAgain => "sent_again",
            Deferral::Waited => "waited",
        };
        self.ending_deferrals.with_label_values(&[then]).inc();
    }

    /// Worker reports deferred so far, whichever became of them.
    pub fn ending_deferrals_total(&self) -> u64 {
        ["sent_again", "waited"]
            .into_iter()
            .map(|then| self.ending_deferrals.with_label_values(&[then]).get())
            .sum()
    }

    pub fn claim_batch(&self, requests: usize, took: Duration) {
        self.claim_duration.observe(took.as_secs_f64());
        self.batch(BatchKind::Claim, requests);
    }

    pub fn batch(&self, kind: BatchKind, requests: usize) {
        let kind = match kind {
            BatchKind::Claim => "claim",
            BatchKind::Ending => "ending",
        };
        self.batch_size.with_label_values(&[kind]).observe(requests as f64);
    }

    pub fn http_request(&self, route: &str, code: u16, took: Duration) {
        self.http_requests.with_label_values(&[route, &code.to_string()]).inc();
        self.http_duration.with_label_values(&[route]).observe(took.as_secs_f64());
    }

    /// Queues claimed first attempts for their queue wait, read later off the claim path.
    pub fn claimed(&self, items: impl IntoIterator<Item = ClaimedItem>) {
        let mut pending = self.pending_waits.lock().unwrap_or_else(PoisonError::into_inner);
        let room = MOST_PENDING_WAITS.saturating_sub(pending.len());
        pending.extend(items.into_iter().take(room));
    }

    /// The claimed first attempts queued since the last call.
    pub fn take_claimed(&self) -> Vec<ClaimedItem> {
        std::mem::take(&mut *self.pending_waits.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records the queue wait of each claimed item whose creation time was read.
    pub fn queue_waits(&self, claimed: &[ClaimedItem], created: &BTreeMap<i64, DateTime<Utc>>) {
        for item in claimed {
            if let Some(created_at) = created.get(&item.id) {
                let waited = (item.claimed_at - *created_at).num_microseconds().unwrap_or(0);
                let labels = self.with_tenant(&item.service, &item.tenant, &[]);
                self.queue_wait.with_label_values(&labels).observe(waited.max(0) as f64 / 1e6);
            }
        }
    }

    /// Takes the database's gauges again, by `take`, unless they were taken less than
    /// --metrics-refresh ago. Scrapes that arrive meanwhile wait for the one taking them. When
    /// `take` fails, the last gauges stay and the next scrape after --metrics-refresh tries again.
    pub async fn refresh_gauges<F, Fut, E>(&self, take: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<
            Output = Result<(Vec<GaugeRow>, BTreeMap<String, DateTime<Utc>>), E>,
        >,
        E: std::fmt::Display,
    {
        let mut snapshot = self.snapshot.lock().await;
        if snapshot.taken.is_some_and(|taken| taken.elapsed() < self.refresh) {
            return;
        }
        let since = snapshot.taken.map(|taken| taken.elapsed().as_secs_f64());
        snapshot.taken = Some(Instant::now());
        let claims = self.claims_with_items(snapshot.seen.iter().map(|(service, _)| service));
        snapshot.claims_per_second = claims
            .iter()
            .filter_map(|(service, total)| {
                // A service first seen has no count from before: its whole count is no rate.
                let before = snapshot.claims.get(service).copied()?;
                let seconds = since.filter(|seconds| *seconds > 0.0)?;
                Some((service.clone(), total.saturating_sub(before) as f64 / seconds))
            })
            .collect();
        snapshot.claims = claims;
        match take().await {
            Ok((rows, asked)) => {
                snapshot.rows = rows;
                snapshot.asked = asked;
            }
            Err(error) => tracing::warn!(%error, "reading the queue gauges for /metrics failed"),
        }
        for (service, asked) in &snapshot.asked {
            let seconds = asked.timestamp_micros() as f64 / 1e6;
            self.last_asked.with_label_values(&[service.as_str()]).set(seconds);
        }
        let Snapshot { rows, seen, .. } = &mut *snapshot;
        for row in rows.iter() {
            seen.insert((
                row.service.clone(),
                self.tenant_label.then(|| row.tenant.clone()).flatten(),
            ));
        }
        self.set_queue_gauges(rows, seen);
    }

    /// This broker's claim requests answered with items, per service.
    fn claims_with_items<'a>(
        &self,
        services: impl Iterator<Item = &'a String>,
    ) -> BTreeMap<String, u64> {
        services
            .map(|service| {
                (service.clone(), self.claims.with_label_values(&[service.as_str(), "item"]).get())
            })
            .collect()
    }

    /// Each service the gauges have shown, summed over tenants, as of the last refresh.
    pub async fn service_summaries(
        &self,
        waiting_workers: &BTreeMap<String, usize>,
        asked_here: &BTreeMap<String, DateTime<Utc>>,
        asked_within: Duration,
    ) -> Vec<ServiceSummary> {
        let snapshot = self.snapshot.lock().await;
        let now = Utc::now().timestamp_micros() as f64 / 1e6;
        // Services with work, and those workers wait on or asked for lately though nothing is
        // queued: an idle service stays in view, and a typo in a worker's service drops out.
        let recent = Utc::now() - chrono::Duration::from_std(asked_within).unwrap_or_default();
        let asked = snapshot.asked.iter().chain(asked_here);
        let services: BTreeSet<&String> = snapshot
            .seen
            .iter()
            .map(|(service, _)| service)
            .chain(asked.filter(|(_, at)| **at >= recent).map(|(service, _)| service))
            .chain(waiting_workers.iter().filter(|(_, n)| **n > 0).map(|(service, _)| service))
            .collect();
        let mut summaries: BTreeMap<&str, ServiceSummary> = BTreeMap::new();
        for service in services {
            summaries.entry(service).or_insert_with(|| ServiceSummary {
                service: service.clone(),
                ready: 0,
                scheduled: 0,
                running: 0,
                paused: 0,
                oldest_ready_age_seconds: None,
                active_users: 0,
                claims_per_second: snapshot.claims_per_second.get(service).copied().unwrap_or(0.0),
                waiting_workers: waiting_workers.get(service).copied().unwrap_or(0),
                // This broker's own asks count at once; other brokers' once written and read.
                last_asked: snapshot.asked.get(service).max(asked_here.get(service)).copied(),
            });
        }
        for row in &snapshot.rows {
            let Some(summary) = summaries.get_mut(row.service.as_str()) else { continue };
            let value = row.value as i64;
            match (row.measure.as_str(), row.tenant.is_some()) {
                ("ready", true) => summary.ready += value,
                ("scheduled", true) => summary.scheduled += value,
                ("running", true) => summary.running += value,
                ("paused", true) => summary.paused += value,
                ("active_users", false) => summary.active_users = value,
                ("oldest_ready", true) => {
                    let age = (now - row.value).max(0.0);
                    let oldest = summary.oldest_ready_age_seconds.get_or_insert(age);
                    *oldest = oldest.max(age);
                }
                _ => {}
            }
        }
        summaries.into_values().collect()
    }

    /// Sets the database's gauges from `rows`: per tenant with the tenant label, else summed
    /// (the oldest item: the oldest of all) over tenants.
    fn set_queue_gauges(&self, rows: &[GaugeRow], seen: &BTreeSet<(String, Option<String>)>) {
        let now = Utc::now().timestamp_micros() as f64 / 1e6;
        self.work_items.reset();
        self.oldest_ready_age.reset();
        self.active_users.reset();
        self.held_back.reset();
        for (service, tenant) in seen {
            let labels = self.series(service, tenant.as_deref());
            for state in STATES {
                self.work_items.with_label_values(&with(&labels, state)).set(0.0);
            }
            self.oldest_ready_age.with_label_values(&labels).set(0.0);
            self.active_users.with_label_values(&labels).set(0.0);
        }
        for row in rows {
            // Active users come summed over tenants from the database (a user may work in
            // several); everything else is per tenant.
            let per_tenant = row.tenant.is_some();
            if row.measure == "active_users" {
                if per_tenant == self.tenant_label {
                    let labels = self.series(&row.service, row.tenant.as_deref());
                    self.active_users.with_label_values(&labels).set(row.value);
                }
                continue;
            }
            if let Some(held) = row.measure.strip_prefix("held_") {
                if let Some((kind, reason)) = held.split_once('_') {
                    self.held_back.with_label_values(&[&row.service, kind, reason]).set(row.value);
                }
                continue;
            }
            let labels = self.series(&row.service, row.tenant.as_deref());
            match row.measure.as_str() {
                "oldest_ready" => {
                    let gauge = self.oldest_ready_age.with_label_values(&labels);
                    gauge.set(gauge.get().max(now - row.value));
                }
                state if STATES.contains(&state) => {
                    self.work_items.with_label_values(&with(&labels, state)).add(row.value);
                }
                other => tracing::warn!(measure = other, "unknown queue gauge"),
            }
        }
    }

    /// Encodes every metric, with the gauges only this broker knows set as of now.
    pub fn render(
        &self,
        waiting_workers: &BTreeMap<String, usize>,
        pool: PoolConnections,
    ) -> Result<String, prometheus::Error> {
        self.waiting_workers.reset();
        for (service, waiting) in waiting_workers {
            self.waiting_workers
                .with_label_values(&[service])
                .set(i64::try_from(*waiting).unwrap_or(i64::MAX));
        }
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.pool_connections.with_label_values(&["in_use"]).set(count(pool.in_use));
        self.pool_connections.with_label_values(&["idle"]).set(count(pool.idle));
        self.pool_max.set(count(pool.max));
        let mut text = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut text)?;
        String::from_utf8(text).map_err(|error| prometheus::Error::Msg(error.to_string()))
    }

    /// The label values of a per-queue series: the service, then the tenant if labelled.
    fn series(&self, service: &str, tenant: Option<&str>) -> Vec<String> {
        let mut labels = vec![service.to_owned()];
        if self.tenant_label {
            labels.push(tenant.unwrap_or_default().to_owned());
        }
        labels
    }

    fn with_tenant(&self, service: &str, tenant: &str, rest: &[&str]) -> Vec<String> {
        let mut labels = self.series(service, Some(tenant));
        labels.extend(rest.iter().map(|label| (*label).to_owned()));
        labels
    }
}

fn with(labels: &[String], last: &str) -> Vec<String> {
    let mut all = labels.to_vec();
    all.push(last.to_owned());
    all
}

/// The content type of the text exposition format.
pub fn content_type() -> String {
    TextEncoder::new().format_type().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One refresh with a service's ready item, as the database would answer it.
    async fn refresh(metrics: &Metrics) {
        let row = GaugeRow {
            service: "render".to_owned(),
            tenant: Some("default".to_owned()),
            measure: "ready".to_owned(),
            value: 1.0,
        };
        metrics.refresh_gauges(|| async { Ok::<_, String>((vec![row], BTreeMap::new())) }).await;
    }

    async fn claims_per_second(metrics: &Metrics) -> f64 {
        let summaries =
            metrics.service_summaries(&BTreeMap::new(), &BTreeMap::new(), Duration::ZERO).await;
        summaries.first().map_or(f64::NAN, |summary| summary.claims_per_second)
    }

    #[tokio::test]
    async fn services_waited_on_or_asked_for_lately_are_listed_with_nothing_queued() {
        let metrics = Metrics::new(Duration::ZERO, false).expect("metrics");
        let now = Utc::now();
        let asked = BTreeMap::from([
            ("idle".to_owned(), now),
            ("typo".to_owned(), now - chrono::Duration::minutes(5)),
        ]);
        let waiting = BTreeMap::from([("waited-on".to_owned(), 2), ("left".to_owned(), 0)]);
        let summaries = metrics.service_summaries(&waiting, &asked, Duration::from_secs(60)).await;
        let listed: Vec<(&str, i64, usize)> = summaries
            .iter()
            .map(|summary| (summary.service.as_str(), summary.ready, summary.waiting_workers))
            .collect();
        assert_eq!(listed, [("idle", 0, 0), ("waited-on", 0, 2)]);
        assert_eq!(summaries[0].last_asked, Some(now));
    }

    #[tokio::test]
    async fn a_service_first_seen_does_not_count_its_past_claims_as_one_intervals() {
        let metrics = Metrics::new(Duration::ZERO, false).expect("metrics");
        for _ in 0..50 {
            metrics.claim_answered("render", ClaimOutcome::Item);
        }
        refresh(&metrics).await;
        refresh(&metrics).await;
        assert_eq!(claims_per_second(&metrics).await, 0.0, "no count from before: no rate");
        metrics.claim_answered("render", ClaimOutcome::Item);
        refresh(&metrics).await;
        assert!(claims_per_second(&metrics).await > 0.0, "a claim since the last refresh");
    }
}
