//! The broker's vocabulary: validated names, ids and the documents it reads and writes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use crate::retry::{RetryDocument, RetrySpec};
use crate::strategy::Metadata;
use crate::traceparent::TraceParent;
use crate::Invalid;

/// A job's id, as producers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A work item's id: the database identity, increasing in creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct WorkItemId(pub i64);

impl std::fmt::Display for WorkItemId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The name of a service: 1..255 characters of `[A-Za-z0-9._:/@-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ServiceName(String);

/// A name of 1..`max` ASCII characters, each `allowed`; `charset` describes them for the error.
struct Charset {
    code: &'static str,
    what: &'static str,
    max: usize,
    allowed: fn(char) -> bool,
    charset: &'static str,
}

impl Charset {
    fn check(&self, name: &str) -> Result<String, Invalid> {
        if name.is_empty() || name.len() > self.max || !name.chars().all(self.allowed) {
            return Err(Invalid::new(
                self.code,
                format!(
                    "{} {name:?} must be 1 to {} characters of {}",
                    self.what, self.max, self.charset
                ),
            ));
        }
        Ok(name.to_owned())
    }
}

impl ServiceName {
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Charset {
            code: "invalid_service",
            what: "service",
            max: 255,
            allowed: |c| c.is_ascii_alphanumeric() || "._:/@-".contains(c),
            charset: "[A-Za-z0-9._:/@-]",
        }
        .check(name)
        .map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name of a user: 1..255 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct UserName(String);

/// Checks a free-form name: 1..255 characters, no NUL (which PostgreSQL text cannot hold).
fn bounded_name(name: &str, code: &'static str, what: &str) -> Result<String, Invalid> {
    let length = name.chars().count();
    if length == 0 || length > 255 || name.contains('\0') {
        return Err(Invalid::new(code, format!("{what} must be 1 to 255 characters, without NUL")));
    }
    Ok(name.to_owned())
}

impl UserName {
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        bounded_name(name, "invalid_user", "user").map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name a worker pod gives itself: 1..255 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct QuerierName(String);

impl QuerierName {
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        bounded_name(name, "invalid_querier", "querier").map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The tenant a job belongs to: 1..255 characters. Jobs that name none belong to `default`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct TenantName(String);

impl TenantName {
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        bounded_name(name, "invalid_tenant", "tenant").map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TenantName {
    fn default() -> Self {
        Self("default".to_owned())
    }
}

/// The query component an item needs: 1..64 characters of `[a-z0-9_-]`; `unknown` by default.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ComponentName(String);

impl ComponentName {
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Charset {
            code: "invalid_component",
            what: "component",
            max: 64,
            allowed: |c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c),
            charset: "[a-z0-9_-]",
        }
        .check(name)
        .map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ComponentName {
    fn default() -> Self {
        Self("unknown".to_owned())
    }
}

/// Loki's actor path below the user: up to three names, each 1..255 characters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ActorPath(Vec<String>);

impl ActorPath {
    pub const MAX_DEPTH: usize = 3;

    pub fn parse(names: &[String]) -> Result<Self, Invalid> {
        if names.len() > Self::MAX_DEPTH {
            return Err(Invalid::new(
                "invalid_actor",
                format!("an actor path has at most {} names", Self::MAX_DEPTH),
            ));
        }
        names
            .iter()
            .map(|name| bounded_name(name, "invalid_actor", "an actor name"))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn names(&self) -> &[String] {
        &self.0
    }
}

/// PostgreSQL's text and jsonb cannot hold a NUL character anywhere: refuse it in anything a
/// client sends for storage, rather than let the database refuse it as an internal error.
pub fn reject_nul(value: &Value, what: &str) -> Result<(), Invalid> {
    let has_nul = |text: &str| text.contains('\0');
    let found = match value {
        Value::String(text) => has_nul(text),
        Value::Array(values) => return values.iter().try_for_each(|value| reject_nul(value, what)),
        Value::Object(fields) => {
            for (key, value) in fields {
                if has_nul(key) {
                    return Err(nul_error(what));
                }
                reject_nul(value, what)?;
            }
            false
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    };
    if found {
        return Err(nul_error(what));
    }
    Ok(())
}

fn nul_error(what: &str) -> Invalid {
    Invalid::new("invalid_text", format!("{what} must not contain NUL characters (\\u0000)"))
}

/// One step of a job's workflow.
#[derive(Debug, Clone)]
pub struct StepSpec {
    pub service: ServiceName,
    /// An aggregating step gets one item whose inputs are all results of the step before it.
    pub aggregate: bool,
}

/// A producer's work item: what to do, and which query component it needs.
#[derive(Debug, Clone)]
pub struct NewItem {
    pub payload: Value,
    pub component: ComponentName,
}

/// A validated job submission.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub user: UserName,
    pub tenant: TenantName,
    pub actor: ActorPath,
    pub is_async: bool,
    pub steps: Vec<StepSpec>,
    /// The first step's items, in order.
    pub items: Vec<NewItem>,
    /// Strategic metadata, which claim strategies filter and count by.
    pub metadata: Metadata,
    /// Higher goes first under the `priority` strategy.
    pub priority: i32,
    /// The job's retry policy as submitted; None: the broker's --max-retries, retried at once.
    pub retry: Option<RetrySpec>,
    /// Its items are scheduled until then rather than ready at once.
    pub not_before: Option<DateTime<Utc>>,
    /// The producer's trace, handed to the job's workers with each item.
    pub traceparent: Option<TraceParent>,
}

impl NewJob {
    pub fn new(
        user: UserName,
        tenant: TenantName,
        actor: ActorPath,
        is_async: bool,
        steps: Vec<StepSpec>,
        items: Vec<NewItem>,
    ) -> Result<Self, Invalid> {
        if steps.is_empty() {
            return Err(Invalid::new("invalid_steps", "a job needs at least one step"));
        }
        if steps[0].aggregate {
            return Err(Invalid::new(
                "invalid_steps",
                "the first step cannot aggregate: there is no step before it",
            ));
        }
        if items.is_empty() {
            return Err(Invalid::new("invalid_items", "a job needs at least one item"));
        }
        items.iter().try_for_each(|item| reject_nul(&item.payload, "a payload"))?;
        Ok(Self {
            user,
            tenant,
            actor,
            is_async,
            steps,
            items,
            metadata: Metadata::default(),
            priority: 0,
            retry: None,
            not_before: None,
            traceparent: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Accepted,
    Running,
    Paused,
    Successful,
    CompleteWithErrors,
    Failed,
    Canceled,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Successful => "successful",
            Self::CompleteWithErrors => "complete_with_errors",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, Self::Successful | Self::CompleteWithErrors | Self::Failed | Self::Canceled)
    }

    pub const ALL: [Self; 7] = [
        Self::Accepted,
        Self::Running,
        Self::Paused,
        Self::Successful,
        Self::CompleteWithErrors,
        Self::Failed,
        Self::Canceled,
    ];

    /// A status a client named, e.g. in a listing's filter.
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == name)
            .ok_or_else(|| unknown_status("job", name, &Self::ALL.map(Self::as_str)))
    }
}

fn unknown_status(what: &str, name: &str, known: &[&str]) -> Invalid {
    Invalid::new(
        "invalid_query",
        format!("status {name:?} is not a {what} status; one of {}", known.join(", ")),
    )
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepDocument {
    pub service: String,
    pub aggregate: bool,
    /// The components of the step's items so far, in name order.
    pub components: Vec<String>,
    pub total: i64,
    pub ready: i32,
    /// Waiting for their time (a retry's delay, or the job's not_before): not claimable yet.
    #[serde(default)]
    pub scheduled: i32,
    pub running: i32,
    pub successful: i32,
    pub failed: i32,
    pub canceled: i32,
}

impl StepDocument {
    fn finished(&self) -> i64 {
        i64::from(self.successful) + i64::from(self.failed) + i64::from(self.canceled)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobDocument {
    pub job_id: JobId,
    pub user: String,
    pub tenant: String,
    pub actor: Vec<String>,
    pub is_async: bool,
    /// Higher goes first under the `priority` strategy.
    pub priority: i32,
    /// The job's strategic metadata: keys and their string or integer values.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: Value,
    pub status: JobStatus,
    pub progress: u8,
    pub steps: Vec<StepDocument>,
    /// The retry policy its items follow; absent: the broker's --max-retries, retried at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDocument>,
    /// The time its submitted items were scheduled for, when the producer named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Progress is the mean, over steps, of the share of each step's items that have finished; a
/// step with no items yet counts as not started. A finished job is at 100.
pub fn progress(status: JobStatus, steps: &[StepDocument]) -> u8 {
    if status.is_finished() {
        return 100;
    }
    if steps.is_empty() {
        return 0;
    }
    let shares: f64 = steps
        .iter()
        .filter(|step| step.total > 0)
        .map(|step| step.finished() as f64 / step.total as f64)
        .sum();
    // Clamped below 100: an unfinished job is never reported as done.
    ((shares / steps.len() as f64) * 100.0).floor().min(99.0) as u8
}

/// A work item as handed to a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkItem {
    pub id: WorkItemId,
    pub job_id: JobId,
    pub service: String,
    pub step: i32,
    pub user: String,
    pub tenant: String,
    pub actor: Vec<String>,
    pub component: String,
    /// Passed through as the database holds it, never parsed: any JSON that PostgreSQL
    /// stored reaches the worker, even a number a parser would refuse.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Box<RawValue>,
    /// The results this item was made from: a JSON array, passed through as `payload` is.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<serde_json::Value>))]
    pub inputs: Box<RawValue>,
    pub attempt: i32,
    pub lease_expires_at: DateTime<Utc>,
    /// The W3C `traceparent` its job was submitted with, so that the worker continues the
    /// producer's trace; absent when the job has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    )]
    pub traceparent: Option<String>,
}

/// Who asks for work.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub service: ServiceName,
    pub querier: QuerierName,
    /// The worker slot within the querier (0..=1023).
    pub worker: i32,
    /// How many items to hand out at most, each chosen as fairly as a single claim.
    pub max: usize,
    /// The strategy's attempts as `claim_items` reads them; None for the fair order.
    pub strategy: Option<std::sync::Arc<Value>>,
    /// The claiming token (tokens.id), recorded on the lease: only it may report on the
    /// attempt. None without auth.
    pub token: Option<i64>,
}

/// What a worker reports about the attempt it holds.
#[derive(Debug, Clone)]
pub enum StatusUpdate {
    /// Still working: extend the lease.
    Running,
    Successful {
        results: Vec<Value>,
        /// Where the items made from these results go; by default this item's component.
        component: Option<ComponentName>,
        /// What the worker warns of though it succeeded, kept on the item.
        warning: Option<String>,
    },
    Failed {
        error: Option<String>,
        retryable: bool,
    },
    /// The worker could not start the item (its command is missing, it is shutting down, the
    /// handler said "not now"): ready again at once, the attempt not counted.
    Released {
        reason: Option<String>,
    },
}

/// An item's status after an update, as the worker is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Ready,
    Running,
    Successful,
    Failed,
    Canceled,
    /// Waiting for its not_before time, then ready.
    Scheduled,
}

impl ItemStatus {
    pub const ALL: [Self; 6] = [
        Self::Ready,
        Self::Running,
        Self::Successful,
        Self::Failed,
        Self::Canceled,
        Self::Scheduled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Successful => "successful",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    /// A status a client named, e.g. in a listing's filter.
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == name)
            .ok_or_else(|| unknown_status("work item", name, &Self::ALL.map(Self::as_str)))
    }
}

/// A row of the user_work table, for operators.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserWorkRow {
    pub user: String,
    pub tenant: String,
    pub actor: Vec<String>,
    pub job_id: JobId,
    pub step: i32,
    pub service: String,
    pub component: String,
    pub is_async: bool,
    pub paused: bool,
    pub ready_count: i32,
    pub running_count: i32,
    pub last_worked: Option<DateTime<Utc>>,
}

/// Where a listing of user_work rows goes on: after the row with this key (user, service, job,
/// step, component). Written as that key's JSON array, which only this broker need read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserWorkCursor(pub String, pub String, pub JobId, pub i32, pub String);

impl UserWorkCursor {
    pub fn parse(cursor: &str) -> Result<Self, Invalid> {
        serde_json::from_str(cursor)
            .map_err(|_| Invalid::new("invalid_query", "after is not a cursor this broker gave"))
    }

    /// The cursor that goes on after `row`.
    pub fn after(row: &UserWorkRow) -> String {
        let key = (&row.user, &row.service, row.job_id, row.step, &row.component);
        serde_json::to_string(&key).unwrap_or_default()
    }
}

/// One user's part of a service's work now.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserShare {
    pub user: String,
    /// Items of the service the user holds running.
    pub running: i64,
    /// Items of the service the user has waiting, claimable.
    pub ready: i64,
    /// The user's weight: its entitled share is its weight's fraction of the active users'.
    pub weight: i32,
    /// The user's tier, 1 to 5: within its tenant, a lower tier is served first.
    pub tier: i32,
    /// The user's cap on running items over every service; 0: none.
    pub max_running: i32,
    /// The user's rate limit, items per second; 0: none.
    pub rate_per_second: f64,
    /// Whether the user is at its cap, so that claims pass it over.
    pub at_cap: bool,
    /// Whether the user's rate limit's bucket is empty, so that claims pass it over.
    pub throttled: bool,
}

/// One metadata value's items of a service, for operators watching caps.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StrategyUsage {
    /// The metadata value: a string or an integer.
    pub value: Value,
    pub running: i64,
    pub ready: i64,
}

/// A counter that differs from a recount of what it counts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Mismatch {
    pub table: String,
    pub key: Value,
    pub recorded: Value,
    pub actual: Value,
}
