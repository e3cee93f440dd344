//! What producers read back: a job's results and errors, its items, a user's or tenant's jobs,
//! each a page at a time by a cursor over an index; and waiting for a job to finish.

use std::pin::pin;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::statements::{ListJobItems, ListJobs};
use super::Jobs;
use crate::core::snapshot;
use crate::db::sql;
use crate::error::BrokerError;
use crate::jobs::{job_documents, read_job};
use fairway_api::model::{ItemStatus, JobDocument, JobId, JobStatus, ServiceName, TenantName};
use fairway_api::pages::{
    ItemDocument, ItemError, ItemFilter, ItemsCursor, ItemsPage, JobOwner, JobsCursor, JobsFilter,
    JobsPage, PageLimit, ResultsCursor, ResultsPage,
};

impl Jobs {
    /// A page of the job's items, in the order they were made.
    pub async fn job_items(
        &self,
        job_id: JobId,
        filter: ItemFilter,
        cursor: ItemsCursor,
        limit: PageLimit,
    ) -> Result<ItemsPage, BrokerError> {
        let client = self.core.client().await?;
        // Known, or 404, before its (then empty) list of items.
        read_job(&client, job_id).await?;
        let statuses = filter.status.map_or(ItemStatus::ALL.to_vec(), |status| vec![status]);
        let steps = filter.step.map_or((0, i32::MAX), |step| (step, step));
        let items = list_items(&client, job_id, &statuses, steps, cursor, limit).await?;
        let next = items.last().map_or(cursor, |item| ItemsCursor(item.id.0));
        let more = limit.filled_by(items.len());
        Ok(ItemsPage { items, next_cursor: next.to_string(), more })
    }

    /// A page of the job's results and errors, read from one snapshot, so that `finished`
    /// says whether the lists can still grow.
    pub async fn job_results(
        &self,
        job_id: JobId,
        cursor: ResultsCursor,
        limit: PageLimit,
    ) -> Result<ResultsPage, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = snapshot(&mut client).await?;
        let job = read_job(&tx, job_id).await?;
        let last_step = i32::try_from(job.steps.len()).unwrap_or(i32::MAX).saturating_sub(1);
        let successful = [ItemStatus::Successful];
        let done =
            list_items(&tx, job_id, &successful, (last_step, last_step), cursor.results, limit)
                .await?;
        let failed = [ItemStatus::Failed];
        let failures =
            list_items(&tx, job_id, &failed, (0, i32::MAX), cursor.errors, limit).await?;
        tx.commit().await?;
        let next_cursor = ResultsCursor {
            results: done.last().map_or(cursor.results, |item| ItemsCursor(item.id.0)),
            errors: failures.last().map_or(cursor.errors, |item| ItemsCursor(item.id.0)),
        };
        let more = limit.filled_by(done.len()) || limit.filled_by(failures.len());
        let mut results = Vec::new();
        for item in &done {
            if let Some(reported) = &item.results {
                // Split, not parsed: each element stays as the database printed it.
                let each: Vec<Box<RawValue>> =
                    serde_json::from_str(reported.get()).map_err(|error| {
                        BrokerError::Unavailable(format!(
                            "results of item {} are not a JSON array: {error}",
                            item.id
                        ))
                    })?;
                results.extend(each);
            }
        }
        let errors = failures
            .into_iter()
            .map(|item| ItemError {
                id: item.id,
                step: item.step,
                attempt: item.attempt,
                error: item.error,
            })
            .collect();
        Ok(ResultsPage {
            job_id,
            status: job.status,
            finished: job.status.is_finished(),
            results,
            errors,
            next_cursor: next_cursor.to_string(),
            more,
        })
    }

    /// A page of a user's or a tenant's jobs, newest first, of those `filter` lets through.
    pub async fn list_jobs(
        &self,
        owner: &JobOwner,
        filter: &JobsFilter,
        cursor: Option<JobsCursor>,
        limit: PageLimit,
    ) -> Result<JobsPage, BrokerError> {
        let client = self.core.client().await?;
        let statuses: Vec<&str> = filter
            .status
            .map_or(JobStatus::ALL.to_vec(), |status| vec![status])
            .into_iter()
            .map(JobStatus::as_str)
            .collect();
        let mut from = cursor.unwrap_or_else(JobsCursor::start);
        // Jobs submitted before a time start the listing there, as if a page had ended at it
        // with an id below every job's.
        if let Some(before) = filter.submitted_before {
            if (before, Uuid::nil()) < (from.created_at, from.job_id) {
                from = JobsCursor { created_at: before, job_id: Uuid::nil() };
            }
        }
        let (user, tenant) = match owner {
            JobOwner::User { user, tenant } => {
                (Some(user.as_str()), tenant.as_ref().map(TenantName::as_str))
            }
            JobOwner::Tenant(tenant) => (None, Some(tenant.as_str())),
        };
        let list = ListJobs {
            user,
            tenant,
            statuses: &statuses,
            before_created_at: from.created_at,
            before_job_id: from.job_id,
            limit: limit.get(),
            service: filter.service.as_ref().map(ServiceName::as_str),
        };
        let rows = sql::fetch_all(&client, &list).await?;
        let next = match rows.last() {
            Some(row) => Some(JobsCursor { created_at: row.created_at, job_id: row.job_id }),
            None => cursor,
        };
        let jobs = job_documents(&client, rows).await?;
        let more = limit.filled_by(jobs.len());
        Ok(JobsPage { jobs, next_cursor: next.map(|cursor| cursor.to_string()), more })
    }

    /// The job once it has finished, or as it is when `wait` (at most --long-poll-max) has
    /// passed, whichever comes first.
    /// Woken by the database's notification that a job finished (any broker's), so that it
    /// reads the job only when it may have finished, not over and over.
    pub async fn wait_for_job(
        &self,
        job_id: JobId,
        wait: Duration,
    ) -> Result<JobDocument, BrokerError> {
        let deadline = tokio::time::Instant::now() + wait.min(self.core.settings.long_poll_max);
        let watch = self.core.signals.watch_job(job_id);
        loop {
            // Registered before the job is read, so that a finish in between is not missed.
            let mut finished = pin!(watch.finished());
            finished.as_mut().enable();
            let job = self.get_job(job_id).await?;
            if job.status.is_finished() {
                return Ok(job);
            }
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                return self.get_job(job_id).await;
            }
        }
    }
}

/// A page of job `job_id`'s items of `statuses` in steps `steps` (first, last) after `cursor`.
async fn list_items(
    client: &impl GenericClient,
    job_id: JobId,
    statuses: &[ItemStatus],
    (first_step, last_step): (i32, i32),
    cursor: ItemsCursor,
    limit: PageLimit,
) -> Result<Vec<ItemDocument>, BrokerError> {
    let statuses: Vec<&str> = statuses.iter().map(|status| status.as_str()).collect();
    let list = ListJobItems {
        job_id: job_id.0,
        statuses: &statuses,
        first_step,
        last_step,
        after_id: cursor.0,
        limit: limit.get(),
    };
    Ok(sql::fetch_all(client, &list).await?)
}
