//! The claim paths under test. Each worker claims, then completes what it claimed in a second
//! transaction, like a real worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{GenericClient, Pool};
use serde_json::{json, Value};
use uuid::Uuid;

use super::seed::{Seeded, SERVICE};
use super::BenchError;
use crate::args::BenchPath;
use crate::sql::{
    self, Params, FIFO_CLAIM, FIFO_COMPLETE, FIFO_COMPLETE_BATCH, FIFO_COUNTED_CLAIM,
    FIFO_COUNTED_COMPLETE_BATCH, FIFO_USER_COUNTED_CLAIM, FIFO_USER_COUNTED_COMPLETE_BATCH,
    HARMONY_CLAIM_ITEM, HARMONY_COUNT_CLAIM, HARMONY_COUNT_COMPLETION, HARMONY_LEAST_RUNNING_JOB,
    HARMONY_LEAST_RUNNING_USER, HARMONY_ROUND_ROBIN_JOB,
};
use fairway_api::model::{ClaimRequest, QuerierName, ServiceName, StatusUpdate, WorkItemId};
use fairway_broker::batch::Batches;
use fairway_broker::Broker;

/// An item a worker holds.
pub struct Claimed {
    pub id: i64,
    pub job: Uuid,
    pub attempt: i32,
}

/// One claim path, ready to be driven by many workers.
pub enum Runner {
    /// The broker's own claim, under a strategy (None: the fair order), worker i claiming
    /// from `services[i mod n]`.
    Broker {
        broker: Broker,
        strategy: Option<Arc<Value>>,
        services: Vec<ServiceName>,
    },
    Sql {
        pool: Pool,
        path: BenchPath,
    },
    /// The FIFO claim and completion behind the broker's group commit: each batch of claims
    /// (how many items each wants) is one statement, and so is each batch of completions;
    /// which statements also says which of the fair order's counters they move.
    FifoBatched {
        pool: Pool,
        statements: FifoStatements,
        claims: Batches<usize, Result<Vec<Claimed>, String>>,
        completions: Batches<i64, Result<(), String>>,
    },
    /// Over HTTP, worker i claiming from `bases[i mod n]`; reports go to any of them, as a
    /// Service would send them.
    Http {
        client: reqwest::Client,
        bases: Vec<String>,
    },
}

/// A batched FIFO path's two statements: the claim, which takes how many items and returns
/// each item's id and job, and the completion, which takes the items' ids.
pub struct FifoStatements {
    claim: &'static str,
    complete: &'static str,
}

impl FifoStatements {
    /// The statements of `path`, if it is a batched FIFO path.
    pub fn of(path: BenchPath) -> Option<Self> {
        let (claim, complete) = match path {
            BenchPath::FifoBatched => (FIFO_CLAIM, FIFO_COMPLETE_BATCH),
            BenchPath::FifoCounted => (FIFO_COUNTED_CLAIM, FIFO_COUNTED_COMPLETE_BATCH),
            BenchPath::FifoUserCounted => {
                (FIFO_USER_COUNTED_CLAIM, FIFO_USER_COUNTED_COMPLETE_BATCH)
            }
            _ => return None,
        };
        Some(Self { claim, complete })
    }
}

impl Runner {
    /// The worker reports the broker deferred so far; None where it runs out of reach.
    pub fn ending_deferrals(&self) -> Option<u64> {
        match self {
            Self::Broker { broker, .. } => Some(broker.metrics().ending_deferrals_total()),
            _ => None,
        }
    }

    async fn claim(&self, worker: usize, max: usize) -> Result<Vec<Claimed>, BenchError> {
        match self {
            Self::Broker { broker, strategy, services } => {
                let Some(service) = services.get(worker % services.len().max(1)) else {
                    return Err(BenchError::Unexpected("no service to claim from".to_owned()));
                };
                let request = ClaimRequest {
                    service: service.clone(),
                    querier: QuerierName::parse("bench")?,
                    worker: (worker % 1024) as i32,
                    max,
                    strategy: strategy.clone(),
                    token: None,
                };
                Ok(broker
                    .claims()
                    .claim(&request)
                    .await?
                    .into_iter()
                    .map(|item| Claimed {
                        id: item.id.0,
                        job: item.job_id.0,
                        attempt: item.attempt,
                    })
                    .collect())
            }
            Self::Sql { pool, path: BenchPath::Fifo } => {
                let client = pool.get().await?;
                let limit = max as i64;
                let rows = sql::query(&client, FIFO_CLAIM, &[&limit]).await?;
                rows.iter()
                    .map(|row| {
                        Ok(Claimed { id: row.try_get(0)?, job: row.try_get(1)?, attempt: 1 })
                    })
                    .collect()
            }
            Self::Sql { pool, path } => harmony_claim(pool, *path, max).await,
            Self::FifoBatched { pool, statements, claims, .. } => {
                let pool = pool.clone();
                let statement = statements.claim;
                let run = move |wants| fifo_claim_batch(pool.clone(), statement, wants);
                // The baseline keeps no lease to give back: an answer no one reads is dropped.
                match claims.submit(max, run, |_| async {}).await {
                    Some(answer) => answer.map_err(BenchError::Unexpected),
                    None => Err(BenchError::Unexpected("a claim batch was lost".to_owned())),
                }
            }
            Self::Http { client, bases } => {
                let base = &bases[worker % bases.len()];
                let url = format!(
                    "{base}/work?service={SERVICE}&querier=bench&worker={}&max={max}",
                    worker % 1024
                );
                let response = client.get(url).send().await?.error_for_status()?;
                if response.status() == reqwest::StatusCode::NO_CONTENT {
                    return Ok(Vec::new());
                }
                let body: Value = response.json().await?;
                let items = body["work_items"].as_array().cloned().unwrap_or_default();
                items
                    .iter()
                    .map(|item| {
                        let job = item["job_id"].as_str().and_then(|id| id.parse().ok());
                        match (item["id"].as_i64(), job, item["attempt"].as_i64()) {
                            (Some(id), Some(job), Some(attempt)) => {
                                Ok(Claimed { id, job, attempt: attempt as i32 })
                            }
                            _ => Err(BenchError::Unexpected(format!("malformed work item {item}"))),
                        }
                    })
                    .collect()
            }
        }
    }

    async fn complete(&self, item: &Claimed) -> Result<(), BenchError> {
        match self {
            Self::Broker { broker, .. } => {
                let update = StatusUpdate::Successful {
                    results: Vec::new(),
                    component: None,
                    warning: None,
                };
                broker
                    .endings()
                    .update_status(WorkItemId(item.id), item.attempt, update, None)
                    .await?;
            }
            Self::Sql { pool, path: BenchPath::Fifo } => {
                let client = pool.get().await?;
                sql::execute(&client, FIFO_COMPLETE, &[&item.id]).await?;
            }
            Self::FifoBatched { pool, statements, completions, .. } => {
                let pool = pool.clone();
                let statement = statements.complete;
                let run = move |ids| fifo_complete_batch(pool.clone(), statement, ids);
                match completions.submit(item.id, run, |_| async {}).await {
                    Some(answer) => answer.map_err(BenchError::Unexpected)?,
                    None => return Err(BenchError::Unexpected("a batch was lost".to_owned())),
                }
            }
            Self::Sql { pool, .. } => {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                sql::execute(&tx, FIFO_COMPLETE, &[&item.id]).await?;
                sql::execute(&tx, HARMONY_COUNT_COMPLETION, &[&item.job, &SERVICE]).await?;
                tx.commit().await?;
            }
            Self::Http { client, bases } => {
                let base = &bases[item.id.unsigned_abs() as usize % bases.len()];
                client
                    .post(format!("{base}/work/{}/status", item.id))
                    .json(
                        &json!({ "status": "successful", "attempt": item.attempt, "results": [] }),
                    )
                    .send()
                    .await?
                    .error_for_status()?;
            }
        }
        Ok(())
    }
}

/// One batch of FIFO claims, `wants[i]` items for request i: one statement takes the oldest
/// ready items for all of them (by `statement`, which takes how many and returns each item's
/// id and job), which are then dealt out in request order.
async fn fifo_claim_batch(
    pool: Pool,
    statement: &'static str,
    wants: Vec<usize>,
) -> Vec<Result<Vec<Claimed>, String>> {
    let taken = async {
        let client = pool.get().await?;
        let limit = wants.iter().sum::<usize>() as i64;
        let rows = sql::query(&client, statement, &[&limit]).await?;
        rows.iter()
            .map(|row| Ok(Claimed { id: row.try_get(0)?, job: row.try_get(1)?, attempt: 1 }))
            .collect::<Result<Vec<_>, BenchError>>()
    }
    .await;
    match taken {
        Ok(items) => {
            let mut items = items.into_iter();
            wants.iter().map(|&want| Ok(items.by_ref().take(want).collect())).collect()
        }
        Err(error) => wants.iter().map(|_| Err(error.to_string())).collect(),
    }
}

/// One batch of FIFO completions, in one `statement`, which takes the items' ids.
async fn fifo_complete_batch(
    pool: Pool,
    statement: &'static str,
    ids: Vec<i64>,
) -> Vec<Result<(), String>> {
    let done = async {
        let client = pool.get().await?;
        sql::execute(&client, statement, &[&ids]).await?;
        Ok::<_, BenchError>(())
    }
    .await;
    ids.iter().map(|_| done.as_ref().map(|_| ()).map_err(ToString::to_string)).collect()
}

/// Harmony's claim: choose a job by its query, then the job's lowest ready item, then its
/// counters, in one transaction; repeated `max` times.
async fn harmony_claim(
    pool: &Pool,
    path: BenchPath,
    max: usize,
) -> Result<Vec<Claimed>, BenchError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let mut claimed = Vec::with_capacity(max);
    for _ in 0..max {
        let Some(job) = harmony_choose_job(&tx, path).await? else { break };
        let Some(row) = sql::query_opt(&tx, HARMONY_CLAIM_ITEM, &[&job]).await? else {
            break;
        };
        sql::execute(&tx, HARMONY_COUNT_CLAIM, &[&job, &SERVICE]).await?;
        claimed.push(Claimed { id: row.try_get(0)?, job, attempt: 1 });
    }
    tx.commit().await?;
    Ok(claimed)
}

async fn harmony_choose_job(
    tx: &impl GenericClient,
    path: BenchPath,
) -> Result<Option<Uuid>, BenchError> {
    let params: Params = &[&SERVICE];
    if path == BenchPath::HarmonyRoundRobin {
        let row = sql::query_opt(tx, HARMONY_ROUND_ROBIN_JOB, params).await?;
        return Ok(row.map(|row| row.try_get(0)).transpose()?);
    }
    let Some(user) = sql::query_opt(tx, HARMONY_LEAST_RUNNING_USER, params).await? else {
        return Ok(None);
    };
    let username: String = user.try_get(0)?;
    let row = sql::query_opt(tx, HARMONY_LEAST_RUNNING_JOB, &[&username, &SERVICE]).await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

/// What the workers of one path measured.
pub struct Measured {
    pub claims: u64,
    pub elapsed: Duration,
    /// Claim latencies, in microseconds.
    pub latencies: Vec<u32>,
    /// Items served per seeded user.
    pub per_user: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// When a run ends: once `duration` has passed and `wanted` items were handed out, or at
/// `max_duration`, or once `cap` items were handed out (so that no user runs out of work
/// because the run outlasted the backlog), whichever comes first.
#[derive(Clone, Copy)]
pub struct Limits {
    pub duration: Duration,
    pub max_duration: Duration,
    pub wanted: u64,
    pub cap: u64,
}

/// Drives `workers` concurrent workers through claim and complete until a limit is reached.
pub async fn measure(
    runner: Arc<Runner>,
    seeded: Arc<Seeded>,
    workers: usize,
    limits: Limits,
    max: usize,
) -> Measured {
    let started = Instant::now();
    let claimed = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..workers)
        .map(|worker| {
            let (runner, seeded, claimed) = (runner.clone(), seeded.clone(), claimed.clone());
            let stop = Stop { started, limits, claimed };
            tokio::spawn(async move { work(&runner, &seeded, worker, &stop, max).await })
        })
        .collect();
    let mut total = Measured {
        claims: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
        per_user: vec![0; seeded.users()],
        errors: 0,
        first_error: None,
    };
    for handle in handles {
        match handle.await {
            Ok(part) => total.absorb(part),
            Err(_) => total.errors += 1,
        }
    }
    total.elapsed = started.elapsed();
    total
}

impl Measured {
    /// Adds `other`'s counts to these (its elapsed time too: workers' parts have none).
    pub fn absorb(&mut self, other: Measured) {
        self.claims += other.claims;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        for (sum, count) in self.per_user.iter_mut().zip(other.per_user) {
            *sum += count;
        }
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
    }
}

struct Stop {
    started: Instant,
    limits: Limits,
    claimed: Arc<AtomicU64>,
}

impl Stop {
    fn reached(&self) -> bool {
        let elapsed = self.started.elapsed();
        let claimed = self.claimed.load(Ordering::Relaxed);
        (elapsed >= self.limits.duration && claimed >= self.limits.wanted)
            || elapsed >= self.limits.max_duration
            || claimed >= self.limits.cap
    }
}

async fn work(
    runner: &Runner,
    seeded: &Seeded,
    worker: usize,
    stop: &Stop,
    max: usize,
) -> Measured {
    let mut measured = Measured {
        claims: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::with_capacity(4096),
        per_user: vec![0; seeded.users()],
        errors: 0,
        first_error: None,
    };
    while !stop.reached() {
        let started = Instant::now();
        let outcome = async {
            let items = runner.claim(worker, max).await?;
            let latency = started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
            for item in &items {
                runner.complete(item).await?;
            }
            Ok::<_, BenchError>((latency, items))
        }
        .await;
        match outcome {
            Ok((latency, items)) if !items.is_empty() => {
                measured.latencies.push(latency);
                measured.claims += items.len() as u64;
                stop.claimed.fetch_add(items.len() as u64, Ordering::Relaxed);
                for item in &items {
                    if let Some(user) = seeded.user_of(&item.job) {
                        measured.per_user[user] += 1;
                    }
                }
            }
            // Every item is held by another worker right now; try again.
            Ok(_) => tokio::task::yield_now().await,
            Err(error) => {
                measured.errors += 1;
                measured.first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    measured
}
