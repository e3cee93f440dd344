//! Pruning: jobs that finished longer ago than the retention go, with their items and counter
//! rows, a small batch per transaction, one broker at a time.

use std::time::Duration;

use serde::Serialize;

use super::statements::{
    FindPrunableJobs, LockPruner, PruneIdempotencyKeys, PruneItems, PruneJobs,
};
use super::{Maintenance, Upkeep};
use crate::db::sql;
use crate::error::BrokerError;
use fairway_api::model::{JobId, JobStatus};

/// The advisory lock a pruning transaction holds, so that brokers prune one at a time.
const PRUNER_LOCK: i64 = 0x6661_6972_7072_756e;

/// Jobs one pruning transaction takes on: their rows are locked until it commits.
const JOBS_PER_BATCH: i64 = 100;

/// Items one pruning transaction deletes at most, so that none holds locks for long or makes a
/// long transaction, whatever the size of the jobs; a bigger job goes over several.
const ITEMS_PER_BATCH: i64 = 1_000;

/// Deletes the jobs past their retention every --prune-interval; each batch logs what it
/// deleted.
pub struct Pruner {
    maintenance: Maintenance,
    retention: Duration,
    interval: Duration,
}

impl Pruner {
    pub fn new(maintenance: &Maintenance, retention: Duration, interval: Duration) -> Self {
        Self { maintenance: maintenance.clone(), retention, interval }
    }
}

impl Upkeep for Pruner {
    const NAME: &'static str = "pruner";
    const WHAT: &'static str = "pruning finished jobs";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self) -> Result<(), BrokerError> {
        self.maintenance.prune_finished_jobs(self.retention).await.map(drop)
    }
}

/// A job the pruner deleted.
#[derive(Debug, Clone, Serialize)]
pub struct PrunedJob {
    pub job_id: JobId,
    pub user: String,
    pub tenant: String,
    pub status: JobStatus,
}

/// What one pruning transaction did.
#[derive(Debug, Clone, Default)]
pub struct PruneBatch {
    pub jobs: Vec<PrunedJob>,
    pub items: i64,
}

/// Whether a pruning transaction found work.
enum Batch {
    Pruned(PruneBatch),
    /// Nothing finished before the cutoff is left, or another broker's pruner holds the lock.
    Done,
}

impl Maintenance {
    /// Deletes every job that finished more than `retention` ago, with its items and counter
    /// rows, in transactions of at most a hundred jobs and a thousand items; gives up at once
    /// when another broker is pruning. Returns the jobs deleted and how many items.
    pub async fn prune_finished_jobs(
        &self,
        retention: Duration,
    ) -> Result<PruneBatch, BrokerError> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let mut pruned = PruneBatch::default();
        while let Batch::Pruned(batch) = self.prune_batch(retention_ms).await? {
            if !batch.jobs.is_empty() || batch.items > 0 {
                let jobs: Vec<String> =
                    batch.jobs.iter().map(|job| job.job_id.to_string()).collect();
                tracing::info!(items = batch.items, ?jobs, "pruned finished jobs");
            }
            let items = u64::try_from(batch.items).unwrap_or(0);
            self.core.metrics.pruned(batch.jobs.len() as u64, items);
            pruned.items += batch.items;
            pruned.jobs.extend(batch.jobs);
        }
        while let Some(deleted) = self.prune_keys_batch().await? {
            tracing::info!(deleted, "pruned expired idempotency keys");
        }
        Ok(pruned)
    }

    /// Deletes a batch of expired Idempotency-Keys under the pruner's lock; None when none is
    /// left or another broker is pruning.
    async fn prune_keys_batch(&self) -> Result<Option<i64>, BrokerError> {
        self.core
            .retrying("prune_idempotency_keys", move || async move {
                let mut client = self.core.client().await?;
                let tx = client.transaction().await?;
                if !sql::fetch_one(&tx, &LockPruner { lock: PRUNER_LOCK }).await?.locked {
                    return Ok(None);
                }
                let prune = PruneIdempotencyKeys { limit: ITEMS_PER_BATCH };
                let deleted = sql::fetch_one(&tx, &prune).await?.deleted;
                tx.commit().await?;
                Ok((deleted > 0).then_some(deleted))
            })
            .await
    }

    async fn prune_batch(&self, retention_ms: i64) -> Result<Batch, BrokerError> {
        self.core.retrying("prune", move || self.prune_batch_once(retention_ms)).await
    }

    async fn prune_batch_once(&self, retention_ms: i64) -> Result<Batch, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        if !sql::fetch_one(&tx, &LockPruner { lock: PRUNER_LOCK }).await?.locked {
            return Ok(Batch::Done);
        }
        let find = FindPrunableJobs { retention_millis: retention_ms, limit: JOBS_PER_BATCH };
        let ids: Vec<uuid::Uuid> =
            sql::fetch_all(&tx, &find).await?.into_iter().map(|job| job.job_id).collect();
        if ids.is_empty() {
            return Ok(Batch::Done);
        }
        let items = sql::fetch_one(&tx, &PruneItems { job_ids: &ids, limit: ITEMS_PER_BATCH })
            .await?
            .deleted;
        let jobs = sql::fetch_all(&tx, &PruneJobs { job_ids: &ids })
            .await?
            .into_iter()
            .map(|job| PrunedJob {
                job_id: JobId(job.job_id),
                user: job.username,
                tenant: job.tenant,
                status: job.status.0,
            })
            .collect();
        tx.commit().await?;
        Ok(Batch::Pruned(PruneBatch { jobs, items }))
    }
}
