//! Bulk actions: pause, resume, cancel or retry every job a filter matches, one job per
//! transaction, so that a bulk action over many jobs never holds more locks than the
//! single-job action does.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statements::{FilteredJob, FindFilteredJobs};
use super::Jobs;
use crate::db::sql;
use crate::error::BrokerError;
use fairway_api::model::{JobId, JobStatus};

/// How many matching jobs are read at a time.
const PAGE: i64 = 100;

/// What a bulk action does to each job it matches: the single-job action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    Pause,
    Resume,
    Cancel,
    Retry,
}

/// Which jobs a bulk action touches: every field set must match (None: any).
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub user: Option<String>,
    pub tenant: Option<String>,
    pub status: Option<JobStatus>,
    /// A job with a step on this service.
    pub service: Option<String>,
    pub submitted_before: Option<DateTime<Utc>>,
    /// Only these tenants' jobs (a producer token's scope); None: every tenant's.
    pub tenants: Option<Vec<String>>,
}

/// How many jobs a bulk action matched, and how many of them it changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkOutcome {
    pub matched: u64,
    pub changed: u64,
}

impl Jobs {
    /// Applies `action` to every job `filter` matches, as the single-job route would. A job
    /// the action does not apply to (already paused, finished, nothing failed) is matched but
    /// not changed; any other error stops the run, the jobs before it keeping their change.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &JobFilter,
    ) -> Result<BulkOutcome, BrokerError> {
        self.each_filtered(Some(action), filter).await
    }

    /// How many jobs `bulk` would match now, changing nothing: it reads the same pages.
    pub async fn count_filtered(&self, filter: &JobFilter) -> Result<u64, BrokerError> {
        Ok(self.each_filtered(None, filter).await?.matched)
    }

    /// Walks every job `filter` matches, applying `action` to each when there is one.
    async fn each_filtered(
        &self,
        action: Option<BulkAction>,
        filter: &JobFilter,
    ) -> Result<BulkOutcome, BrokerError> {
        let mut outcome = BulkOutcome::default();
        let mut after = Uuid::nil();
        loop {
            let page = {
                let client = self.core.client().await?;
                let find = FindFilteredJobs {
                    user: filter.user.as_deref(),
                    tenant: filter.tenant.as_deref(),
                    status: filter.status.map(JobStatus::as_str),
                    service: filter.service.as_deref(),
                    submitted_before: filter.submitted_before,
                    tenants: filter.tenants.as_deref(),
                    after,
                    limit: PAGE,
                };
                sql::fetch_all(&client, &find).await?
            };
            let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= PAGE;
            for FilteredJob { job_id, status } in page {
                after = job_id;
                outcome.matched += 1;
                let Some(action) = action else { continue };
                if self.act(action, JobId(job_id), &status).await? {
                    outcome.changed += 1;
                }
            }
            if !full {
                return Ok(outcome);
            }
        }
    }

    /// One job's action, in its own transaction; whether it changed the job (`status`: the
    /// job's status when it was matched).
    async fn act(
        &self,
        action: BulkAction,
        job_id: JobId,
        status: &str,
    ) -> Result<bool, BrokerError> {
        let was = |wanted: JobStatus| status == wanted.as_str();
        let result = match action {
            BulkAction::Pause => self.pause_job(job_id).await.map(|_| !was(JobStatus::Paused)),
            BulkAction::Resume => self.resume_job(job_id).await.map(|_| was(JobStatus::Paused)),
            BulkAction::Cancel => self.cancel_job(job_id).await.map(|_| !was(JobStatus::Canceled)),
            BulkAction::Retry => self.retry_job(job_id).await.map(|_| true),
        };
        match result {
            Ok(changed) => Ok(changed),
            // Not this action's job (finished, nothing failed), or pruned meanwhile.
            Err(BrokerError::Conflict { .. } | BrokerError::NotFound { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }
}
