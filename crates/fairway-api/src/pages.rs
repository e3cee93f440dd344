//! Paged listings: page sizes, the cursors that continue them, and the pages themselves.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::model::{
    ItemStatus, JobDocument, JobId, JobStatus, ServiceName, TenantName, UserName, WorkItemId,
};
use crate::Invalid;

/// How many entries a page holds: 1 to 10,000, 1,000 unless the client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit(i64);

impl PageLimit {
    pub const MAX: i64 = 10_000;

    pub fn new(limit: i64) -> Result<Self, Invalid> {
        if !(1..=Self::MAX).contains(&limit) {
            return Err(Invalid::new(
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

fn invalid_cursor(cursor: &str) -> Invalid {
    Invalid::new(
        "invalid_query",
        format!("cursor {cursor:?} is not one this listing gave; start without a cursor"),
    )
}

/// An item id a cursor names: a positive decimal number.
fn parse_item_id(text: &str, cursor: &str) -> Result<i64, Invalid> {
    text.parse::<i64>().ok().filter(|id| *id >= 0).ok_or_else(|| invalid_cursor(cursor))
}

/// Where a listing of a job's items goes on: after the item with this id. Items are listed in
/// the order they were made, so items made while a reader pages come after its cursor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemsCursor(pub i64);

impl ItemsCursor {
    pub fn parse(cursor: &str) -> Result<Self, Invalid> {
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
    pub results: ItemsCursor,
    pub errors: ItemsCursor,
}

impl ResultsCursor {
    pub fn parse(cursor: &str) -> Result<Self, Invalid> {
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
    pub created_at: DateTime<Utc>,
    pub job_id: Uuid,
}

impl JobsCursor {
    pub fn parse(cursor: &str) -> Result<Self, Invalid> {
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
    pub fn start() -> Self {
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemDocument {
    pub id: WorkItemId,
    pub step: i32,
    pub status: ItemStatus,
    pub attempt: i32,
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Box<RawValue>,
    /// The results this item was made from.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<serde_json::Value>))]
    pub inputs: Box<RawValue>,
    /// What its worker reported, once it succeeded.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<serde_json::Value>>))]
    pub results: Option<Box<RawValue>>,
    /// Why it failed, when it did (the last attempt's error while it is retried).
    pub error: Option<String>,
    /// What its worker warned of when it succeeded (no data in a granule, say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// How often a worker handed it back (status `released`): attempts that did not count.
    pub releases: i32,
    /// The reason the last worker to hand it back gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_reason: Option<String>,
    /// When a scheduled item becomes ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A page of a job's items. `next_cursor` goes on after the last item listed so far; `more`
/// says that the page is full, so that more items may follow now (later, others may be made).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemsPage {
    pub items: Vec<ItemDocument>,
    pub next_cursor: String,
    pub more: bool,
}

/// An item that failed for good, and why.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemError {
    pub id: WorkItemId,
    pub step: i32,
    pub attempt: i32,
    pub error: Option<String>,
}

/// A page of a job's results: those of its last step's successful items, in item order, and
/// its failed items' errors. Each list holds those of up to the page's limit of items; `more`
/// says that one of them is full.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultsPage {
    pub job_id: JobId,
    pub status: JobStatus,
    /// Whether the job has finished: until then, more results and errors may come.
    pub finished: bool,
    /// Each item's results in turn, passed through as the database holds them.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<serde_json::Value>))]
    pub results: Vec<Box<RawValue>>,
    pub errors: Vec<ItemError>,
    pub next_cursor: String,
    pub more: bool,
}

/// A page of jobs, newest first. `next_cursor` is null only when nothing was listed yet;
/// `more` says that the page is full.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// Which of a user's or a tenant's jobs a listing wants (None: any).
#[derive(Debug, Clone, Default)]
pub struct JobsFilter {
    pub status: Option<JobStatus>,
    /// Jobs with a step on this service.
    pub service: Option<ServiceName>,
    /// Jobs created before this time.
    pub submitted_before: Option<DateTime<Utc>>,
}

/// Whose jobs a listing wants: a user's (in one tenant, or all), or a tenant's.
#[derive(Debug, Clone)]
pub enum JobOwner {
    User { user: UserName, tenant: Option<TenantName> },
    Tenant(TenantName),
}
