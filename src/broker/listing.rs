//! What producers read back: a job's results and errors, its items, a user's or tenant's jobs,
//! each a page at a time by a cursor over an index; and waiting for a job to finish.

use std::pin::pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

use super::jobs::{job_documents, read_job};
use super::model::{ItemStatus, JobDocument, JobId, JobStatus, TenantName, UserName, WorkItemId};
use super::rows;
use super::{snapshot, Broker, BrokerError};
use crate::db::sql::{self, LIST_JOB_ITEMS, LIST_TENANT_JOBS, LIST_USER_JOBS};

/// How many entries a page holds: 1 to 10,000, 1,000 unless the client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit(i64);

impl PageLimit {
    pub const MAX: i64 = 10_000;

    pub fn new(limit: i64) -> Result<Self, BrokerError> {
        if !(1..=Self::MAX).contains(&limit) {
            return Err(BrokerError::invalid(
                "invalid_query",
                format!("limit must be between 1 and {}", Self::MAX),
            ));
        }
        Ok(Self(limit))
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// Whether a page of `entries` entries is full: then more may follow at once.
    pub fn filled_by(self, entries: usize) -> bool {
        i64::try_from(entries).unwrap_or(i64::MAX) >= self.0
    }
}

impl Default for PageLimit {
    fn default() -> Self {
        Self(1_000)
    }
}

fn invalid_cursor(cursor: &str) -> BrokerError {
    BrokerError::invalid(
        "invalid_query",
        format!("cursor {cursor:?} is not one this listing gave; start without a cursor"),
    )
}

/// An item id a cursor names: a positive decimal number.
fn parse_item_id(text: &str, cursor: &str) -> Result<i64, BrokerError> {
    text.parse::<i64>().ok().filter(|id| *id >= 0).ok_or_else(|| invalid_cursor(cursor))
}

/// Where a listing of a job's items goes on: after the item with this id. Items are listed in
/// the order they were made, so items made while a reader pages come after its cursor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemsCursor(i64);

impl ItemsCursor {
    pub fn parse(cursor: &str) -> Result<Self, BrokerError> {
        parse_item_id(cursor, cursor).map(Self)
    }
}

impl std::fmt::Display for ItemsCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a reading of a job's results goes on: after this result item, and after this failed
/// item. Written `<result item>.<failed item>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResultsCursor {
    results: ItemsCursor,
    errors: ItemsCursor,
}

impl ResultsCursor {
    pub fn parse(cursor: &str) -> Result<Self, BrokerError> {
        let (results, errors) = cursor.split_once('.').ok_or_else(|| invalid_cursor(cursor))?;
        Ok(Self {
            results: ItemsCursor(parse_item_id(results, cursor)?),
            errors: ItemsCursor(parse_item_id(errors, cursor)?),
        })
    }
}

impl std::fmt::Display for ResultsCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.results, self.errors)
    }
}

/// Where a listing of jobs, newest first, goes on: after (older than) this job. Written
/// `<created_at in microseconds since 1970>.<job id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobsCursor {
    created_at: DateTime<Utc>,
    job_id: Uuid,
}

impl JobsCursor {
    pub fn parse(cursor: &str) -> Result<Self, BrokerError> {
        let (micros, job_id) = cursor.split_once('.').ok_or_else(|| invalid_cursor(cursor))?;
        // Between 1970 and 9999, which every job's created_at is and PostgreSQL can compare.
        let created_at = micros
            .parse::<i64>()
            .ok()
            .filter(|micros| (0..=Self::start().created_at.timestamp_micros()).contains(micros))
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(|| invalid_cursor(cursor))?;
        let job_id = Uuid::parse_str(job_id).map_err(|_| invalid_cursor(cursor))?;
        Ok(Self { created_at, job_id })
    }

    /// Before every job: newer than any job can be, and the greatest id.
    fn start() -> Self {
        let far_future =
            DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::UNIX_EPOCH);
        Self { created_at: far_future, job_id: Uuid::max() }
    }
}

impl std::fmt::Display for JobsCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.created_at.timestamp_micros(), self.job_id)
    }
}

/// A work item as producers see it. Its JSON is passed through as the database holds it, never
/// parsed, as workers get it (`WorkItem`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ItemDocument {
    pub id: WorkItemId,
    pub step: i32,
    pub status: ItemStatus,
    pub attempt: i32,
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    /// The results this item was made from.
    #[schema(value_type = Vec<serde_json::Value>)]
    pub inputs: Box<RawValue>,
    /// What its worker reported, once it succeeded.
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    pub results: Option<Box<RawValue>>,
    /// Why it failed, when it did (the last attempt's error while it is retried).
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A page of a job's items. `next_cursor` goes on after the last item listed so far; `more`
/// says that the page is full, so that more items may follow now (later, others may be made).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ItemsPage {
    pub items: Vec<ItemDocument>,
    pub next_cursor: String,
    pub more: bool,
}

/// An item that failed for good, and why.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ItemError {
    pub id: WorkItemId,
    pub step: i32,
    pub attempt: i32,
    pub error: Option<String>,
}

/// A page of a job's results: those of its last step's successful items, in item order, and
/// its failed items' errors. Each list holds those of up to the page's limit of items; `more`
/// says that one of them is full.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResultsPage {
    pub job_id: JobId,
    pub status: JobStatus,
    /// Whether the job has finished: until then, more results and errors may come.
    pub finished: bool,
    /// Each item's results in turn, passed through as the database holds them.
    #[schema(value_type = Vec<serde_json::Value>)]
    pub results: Vec<Box<RawValue>>,
    pub errors: Vec<ItemError>,
    pub next_cursor: String,
    pub more: bool,
}

/// A page of jobs, newest first. `next_cursor` is null only when nothing was listed yet;
/// `more` says that the page is full.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobsPage {
    pub jobs: Vec<JobDocument>,
    pub next_cursor: Option<String>,
    pub more: bool,
}

/// Which of a job's items a listing wants.
#[derive(Debug, Clone, Copy, Default)]
pub struct ItemFilter {
    pub step: Option<i32>,
    pub status: Option<ItemStatus>,
}

/// Whose jobs a listing wants: a user's (in one tenant, or all), or a tenant's.
#[derive(Debug, Clone)]
pub enum JobOwner {
    User { user: UserName, tenant: Option<TenantName> },
    Tenant(TenantName),
}

impl Broker {
    /// A page of the job's items, in the order they were made.
    pub async fn job_items(
        &self,
        job_id: JobId,
        filter: ItemFilter,
        cursor: ItemsCursor,
        limit: PageLimit,
    ) -> Result<ItemsPage, BrokerError> {
        let client = self.client().await?;
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
        let mut client = self.client().await?;
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

    /// A page of a user's or a tenant's jobs, newest first, optionally of one status.
    pub async fn list_jobs(
        &self,
        owner: &JobOwner,
        status: Option<JobStatus>,
        cursor: Option<JobsCursor>,
        limit: PageLimit,
    ) -> Result<JobsPage, BrokerError> {
        let client = self.client().await?;
        let statuses: Vec<&str> = status
            .map_or(JobStatus::ALL.to_vec(), |status| vec![status])
            .into_iter()
            .map(JobStatus::as_str)
            .collect();
        let from = cursor.unwrap_or_else(JobsCursor::start);
        let rows = match owner {
            JobOwner::User { user, tenant } => {
                let tenant = tenant.as_ref().map(TenantName::as_str);
                let params: sql::Params =
                    &[&user.as_str(), &tenant, &statuses, &from.created_at, &from.job_id, &limit.0];
                sql::query(&client, LIST_USER_JOBS, params).await?
            }
            JobOwner::Tenant(tenant) => {
                let params: sql::Params =
                    &[&tenant.as_str(), &statuses, &from.created_at, &from.job_id, &limit.0];
                sql::query(&client, LIST_TENANT_JOBS, params).await?
            }
        };
        let next = match rows.last() {
            Some(row) => Some(JobsCursor {
                created_at: row.try_get("created_at")?,
                job_id: row.try_get("job_id")?,
            }),
            None => cursor,
        };
        let jobs = job_documents(&client, &rows).await?;
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
        let deadline = tokio::time::Instant::now() + wait.min(self.settings.long_poll_max);
        let watch = self.signals.watch_job(job_id);
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
    let params: sql::Params = &[&job_id.0, &statuses, &first_step, &last_step, &cursor.0, &limit.0];
    let rows = sql::query(client, LIST_JOB_ITEMS, params).await?;
    rows.iter().map(rows::item_document).collect()
}
