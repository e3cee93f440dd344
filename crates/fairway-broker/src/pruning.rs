//! Pruning: jobs that finished longer ago than the retention go, with their items and counter
//! rows, a small batch per transaction, one broker at a time.

use std::time::Duration;

use serde::Serialize;

use crate::db::sql::{self, FIND_PRUNABLE_JOBS, LOCK_PRUNER, PRUNE_ITEMS, PRUNE_JOBS};
use crate::{BrokerError, Maintenance};
use fairway_api::model::{JobId, JobStatus};

/// The advisory lock a pruning transaction holds, so that brokers prune one at a time.
const PRUNER_LOCK: i64 = 0x6661_6972_7072_756e;

/// Jobs one pruning transaction takes on: their rows are locked until it commits.
const JOBS_PER_BATCH: i64 = 100;

/// Items one pruning transaction deletes at most, so that none holds locks for long or makes a
/// long transaction, whatever the size of the jobs; a bigger job goes over several.
const ITEMS_PER_BATCH: i64 = 1_000;

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
        Ok(pruned)
    }

    async fn prune_batch(&self, retention_ms: i64) -> Result<Batch, BrokerError> {
        self.core.retrying("prune", move || self.prune_batch_once(retention_ms)).await
    }

    async fn prune_batch_once(&self, retention_ms: i64) -> Result<Batch, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        if !sql::query_one(&tx, LOCK_PRUNER, &[&PRUNER_LOCK]).await?.try_get::<_, bool>("locked")? {
            return Ok(Batch::Done);
        }
        let doomed = sql::query(&tx, FIND_PRUNABLE_JOBS, &[&retention_ms, &JOBS_PER_BATCH]).await?;
        if doomed.is_empty() {
            return Ok(Batch::Done);
        }
        let ids = doomed
            .iter()
            .map(|row| row.try_get("job_id"))
            .collect::<Result<Vec<uuid::Uuid>, _>>()?;
        let items: i64 = sql::query_one(&tx, PRUNE_ITEMS, &[&ids, &ITEMS_PER_BATCH])
            .await?
            .try_get("deleted")?;
        let jobs = sql::query(&tx, PRUNE_JOBS, &[&ids])
            .await?
            .iter()
            .map(|row| {
                Ok(PrunedJob {
                    job_id: JobId(row.try_get("job_id")?),
                    user: row.try_get("username")?,
                    tenant: row.try_get("tenant")?,
                    status: crate::rows::stored_job_status(row.try_get("status")?)?,
                })
            })
            .collect::<Result<Vec<_>, BrokerError>>()?;
        tx.commit().await?;
        Ok(Batch::Pruned(PruneBatch { jobs, items }))
    }
}
