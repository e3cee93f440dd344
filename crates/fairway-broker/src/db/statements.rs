//! Every statement the broker runs, one per file of `sql/`: its parameters by name, in the
//! order the file numbers them, and the row it answers. Rows that become API documents decode
//! in `rows.rs`; the rest are declared here beside their statement.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::types::Json;
use tokio_postgres::Row;
use uuid::Uuid;

use super::sql::{row, statement, FromRow};
use crate::metrics::GaugeRow;
use crate::rows::{JobRow, StepRow, Stored, TokenRow};
use fairway_api::model::{ItemStatus, JobStatus, Mismatch, StrategyUsage, UserShare, UserWorkRow};
use fairway_api::pages::ItemDocument;
use fairway_api::tenancy::{QuerierDocument, TenantDocument};
use fairway_api::tokens::TokenDocument;

// Idempotent submissions.

statement! {
    /// Takes an Idempotency-Key for a submission, first in its transaction.
    RememberIdempotencyKey<'a> = "remember_idempotency_key" -> Remembered {
        scope: &'a str,
        key: &'a str,
        request_digest: &'a [u8],
        job_id: Uuid,
        response: Json<&'a Value>,
        ttl_millis: i64,
    }
}

row! {
    Remembered {
        remembered: bool,
    }
}

statement! {
    /// A live Idempotency-Key: what made it, and its answer.
    FindIdempotencyKey<'a> = "find_idempotency_key" -> IdempotencyKeyRow {
        scope: &'a str,
        key: &'a str,
    }
}

row! {
    IdempotencyKeyRow {
        job_id: Uuid,
        request_digest: Vec<u8>,
        response: Json<Value>,
    }
}

// Claims.

statement! {
    /// Claims for a batch of workers in one transaction: request i is the i-th of each array.
    ClaimItems<'a> = "claim_items" -> ClaimedRow {
        services: &'a [&'a str],
        queriers: &'a [&'a str],
        workers: &'a [i32],
        maxes: &'a [i32],
        lease_millis: i64,
        touch_every_millis: i64,
        strategies: &'a [Option<&'a Value>],
        tokens: &'a [Option<i64>],
    }
}

row! {
    /// A claimed item, or (with `id` NULL) how a request of the batch that got nothing stands.
    ClaimedRow {
        /// The 1-based index of the request in the batch.
        request: i32,
        /// The querier's membership: NULL when it has not joined.
        querier_state: Option<String>,
        username: Option<String>,
        id: Option<i64>,
        job_id: Option<Uuid>,
        step_index: Option<i32>,
        component: Option<String>,
        payload: Option<Json<Box<RawValue>>>,
        inputs: Option<Json<Box<RawValue>>>,
        attempt: Option<i32>,
        lease_expires_at: Option<DateTime<Utc>>,
        tenant: Option<String>,
        actor: Option<Vec<String>>,
        /// A strategy that stopped before the fair order passed over work another claim held.
        passed_over: Option<bool>,
        /// The producer's trace the item's job was submitted in, if any.
        traceparent: Option<String>,
    }
}

statement! {
    /// The traceparents of the jobs a claim batch handed out items of, for those that have one.
    JobTraceparents<'a> = "job_traceparents" -> JobTraceparent {
        job_ids: &'a [Uuid],
    }
}

row! {
    /// A job's W3C traceparent.
    JobTraceparent {
        job_id: Uuid,
        traceparent: String,
    }
}

statement! {
    /// Whether the service has claimable work for the querier at all.
    HasClaimableWork<'a> = "has_claimable_work" -> () {
        service: &'a str,
        querier: &'a str,
    }
}

statement! {
    /// Whether any job has named the service.
    ServiceIsNamed<'a> = "service_is_named" -> Named {
        service: &'a str,
    }
}

row! {
    Named {
        named: bool,
    }
}

// Endings.

statement! {
    /// Ends the attempts of a batch: ending i is the i-th of each array.
    FinishItems<'a> = "finish_items" -> FinishedRow {
        ids: &'a [i64],
        attempts: &'a [i32],
        statuses: &'a [&'a str],
        results: &'a [Option<Json<&'a Vec<Value>>>],
        errors: &'a [Option<&'a str>],
        next_components: &'a [Option<&'a str>],
        digests: &'a [Option<&'a [u8]>],
        uncounted: &'a [bool],
        expired_only: bool,
        wait_for_owners: bool,
        tokens: &'a [Option<i64>],
        /// A scheduled retry's delay (NULL for any other ending).
        delays_millis: &'a [Option<i64>],
        /// A worker handing the item back.
        handed_back: &'a [bool],
        /// A successful ending's warning.
        warnings: &'a [Option<&'a str>],
    }
}

/// An ending finish_items answered: applied, or (`applied` None) deferred, its owner held by
/// another transaction.
pub struct FinishedRow {
    /// The 1-based index of the ending in the batch.
    pub ending: i32,
    pub applied: Option<AppliedEnding>,
}

impl FromRow for FinishedRow {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        let deferred: bool = row.try_get("deferred")?;
        let applied = if deferred { None } else { Some(AppliedEnding::from_row(row)?) };
        Ok(Self { ending: row.try_get("ending")?, applied })
    }
}

row! {
    /// What an applied ending changed, and what must follow it in the same transaction.
    AppliedEnding {
        job_id: Uuid,
        step_index: i32,
        component: String,
        /// The component of the next step's items made from the results.
        results_component: Option<String>,
        querier_leaving: bool,
        fans_out: bool,
        may_aggregate: bool,
        service: String,
        tenant: String,
        became_claimable: bool,
        /// Whether the ending's tenant row moved already, or is left to the caller.
        tenant_applied: bool,
        job_open_items: i32,
    }
}

statement! {
    /// A heartbeat: a row when the lease of the current attempt was extended.
    ExtendLease = "extend_lease" -> () {
        id: i64,
        attempt: i32,
        lease_millis: i64,
        token: Option<i64>,
    }
}

statement! {
    /// The item as an ending that did not apply needs it explained.
    DescribeItem = "describe_item" -> ItemState {
        id: i64,
    }
}

row! {
    ItemState {
        status: String,
        attempt: i32,
        claimed_by: Option<i64>,
        ended_as: Option<Stored<ItemStatus>>,
        ending_digest: Option<Vec<u8>>,
    }
}

statement! {
    FindExpiredLeases = "find_expired_leases" -> ExpiredLease {
        limit: i64,
    }
}

row! {
    ExpiredLease {
        id: i64,
        attempt: i32,
    }
}

statement! {
    /// Fan-out: the next step's items from an item's results.
    InsertNextStepItems = "insert_next_step_items" -> Created {
        id: i64,
        step: i32,
    }
}

row! {
    Created {
        count: i32,
    }
}

statement! {
    /// Whether the job's aggregating step is due its single item, and of which component.
    PlanAggregateItem = "plan_aggregate_item" -> AggregatePlan {
        job_id: Uuid,
    }
}

row! {
    AggregatePlan {
        step_index: i32,
        component: String,
    }
}

statement! {
    InsertAggregateItem<'a> = "insert_aggregate_item" -> () {
        job_id: Uuid,
        step: i32,
        component: &'a str,
    }
}

statement! {
    /// Finishes each of the jobs that has nothing ready or running.
    RefreshJobStatus<'a> = "refresh_job_status" -> () {
        job_ids: &'a [Uuid],
    }
}

// Jobs.

statement! {
    CreateUser<'a> = "create_user" -> () {
        user: &'a str,
    }
}

statement! {
    LockUser<'a> = "lock_user" -> () {
        user: &'a str,
    }
}

statement! {
    CreateTenant<'a> = "create_tenant" -> () {
        tenant: &'a str,
    }
}

statement! {
    /// The tenant's max_outstanding, locking its row when it has one.
    LockTenantLimit<'a> = "lock_tenant_limit" -> TenantLimit {
        tenant: &'a str,
    }
}

row! {
    TenantLimit {
        max_outstanding: i32,
    }
}

statement! {
    CountOutstanding<'a> = "count_outstanding" -> Outstanding {
        tenant: &'a str,
    }
}

row! {
    Outstanding {
        outstanding: i64,
    }
}

statement! {
    InsertJob<'a> = "insert_job" -> () {
        job_id: Uuid,
        user: &'a str,
        is_async: bool,
        tenant: &'a str,
        actor: &'a [String],
        priority: i32,
        retry_max_attempts: Option<i32>,
        retry_backoff: Option<&'a str>,
        retry_initial_ms: Option<i64>,
        retry_max_ms: Option<i64>,
        not_before: Option<DateTime<Utc>>,
        traceparent: Option<&'a str>,
    }
}

statement! {
    InsertJobSteps<'a> = "insert_job_steps" -> () {
        job_id: Uuid,
        services: &'a [&'a str],
        aggregates: &'a [bool],
    }
}

statement! {
    InsertJobMetadata<'a> = "insert_job_metadata" -> () {
        job_id: Uuid,
        keys: &'a [String],
        values: &'a [Value],
        services: &'a [&'a str],
    }
}

statement! {
    InsertFirstStepItems<'a> = "insert_first_step_items" -> () {
        job_id: Uuid,
        payloads: &'a [&'a Value],
        components: &'a [&'a str],
        /// Scheduled until then; None: ready.
        not_before: Option<DateTime<Utc>>,
    }
}

statement! {
    /// Makes sure a step has its counter rows for each of the components.
    CreateStepQueues<'a> = "create_step_queues" -> () {
        job_id: Uuid,
        step: i32,
        components: &'a [&'a str],
    }
}

statement! {
    /// Moves a step's item counts of one component, with the fair-order rows that follow them.
    ApplyStepDeltas<'a> = "apply_step_deltas" -> StepChange {
        job_id: Uuid,
        step: i32,
        component: &'a str,
        ready: i32,
        running: i32,
        successful: i32,
        failed: i32,
        canceled: i32,
        scheduled: i32,
        /// The transaction's only step change: the tenant's row moves now too.
        tenant_now: bool,
    }
}

row! {
    /// All NULL when the job has no such step.
    StepChange {
        service: Option<String>,
        tenant: Option<String>,
        became_claimable: Option<bool>,
        job_open_items: Option<i32>,
    }
}

statement! {
    /// A transaction's tenant_queues changes, last and in key order.
    ApplyTenantDeltas<'a> = "apply_tenant_deltas" -> () {
        services: &'a [String],
        components: &'a [String],
        tenants: &'a [String],
        running: &'a [i32],
        activate: &'a [bool],
    }
}

statement! {
    NotifyWorkReady<'a> = "notify_work_ready" -> () {
        service: &'a str,
    }
}

statement! {
    NotifyJobFinished = "notify_job_finished" -> () {
        job_id: Uuid,
    }
}

statement! {
    GetJob = "get_job" -> JobRow {
        job_id: Uuid,
    }
}

statement! {
    /// The steps of each of the jobs, by job and step.
    GetJobsSteps<'a> = "get_jobs_steps" -> StepRow {
        job_ids: &'a [Uuid],
    }
}

statement! {
    JobTenant = "job_tenant" -> JobTenantRow {
        job_id: Uuid,
    }
}

row! {
    JobTenantRow {
        tenant: String,
    }
}

statement! {
    /// Takes the row lock of the user who owns the job; no row, no such job.
    LockJobOwner = "lock_job_owner" -> () {
        job_id: Uuid,
    }
}

statement! {
    /// Pauses or resumes the job's steps; answers the services whose work came back.
    SetJobPaused = "set_job_paused" -> ResumedService {
        job_id: Uuid,
        paused: bool,
    }
}

row! {
    ResumedService {
        service: String,
    }
}

statement! {
    SetJobStatus<'a> = "set_job_status" -> () {
        job_id: Uuid,
        status: &'a str,
    }
}

statement! {
    /// Cancels every ready, scheduled or running item of the job; answers how many, per step
    /// and component.
    CancelJobItems = "cancel_job_items" -> CanceledItems {
        job_id: Uuid,
    }
}

row! {
    CanceledItems {
        step_index: i32,
        component: String,
        ready: i32,
        scheduled: i32,
        running: i32,
    }
}

statement! {
    /// Puts every failed item of the job back to ready with a fresh retry budget; answers how
    /// many, per step and component.
    RetryJobItems = "retry_job_items" -> RetriedItems {
        job_id: Uuid,
    }
}

row! {
    RetriedItems {
        step_index: i32,
        component: String,
        retried: i32,
    }
}

statement! {
    /// The next page of jobs, in id order, that match a bulk action's filter.
    FindFilteredJobs<'a> = "find_filtered_jobs" -> FilteredJob {
        user: Option<&'a str>,
        tenant: Option<&'a str>,
        status: Option<&'a str>,
        service: Option<&'a str>,
        submitted_before: Option<DateTime<Utc>>,
        tenants: Option<&'a [String]>,
        after: Uuid,
        limit: i64,
    }
}

row! {
    FilteredJob {
        job_id: Uuid,
        status: String,
    }
}

statement! {
    /// The attempt each item's retry budget starts from, and its job's retry policy.
    ItemRetryPolicies<'a> = "item_retry_policies" -> ItemRetryPolicy {
        ids: &'a [i64],
    }
}

row! {
    ItemRetryPolicy {
        id: i64,
        retry_base: i32,
        retry_max_attempts: Option<i32>,
        retry_backoff: Option<String>,
        retry_initial_ms: Option<i64>,
        retry_max_ms: Option<i64>,
    }
}

statement! {
    /// Makes up to `limit` due scheduled items ready, unless another broker's pass holds the
    /// promoter's lock (`promoted` NULL).
    PromoteScheduledItems = "promote_scheduled_items" -> Promoted {
        lock: i64,
        limit: i32,
    }
}

row! {
    Promoted {
        promoted: Option<i32>,
    }
}

statement! {
    /// A page of a user's jobs (`user` set, optionally only `tenant`'s) or of a tenant's
    /// (`user` NULL), newest first, optionally only those with a step on `service`.
    ListJobs<'a> = "list_jobs" -> JobRow {
        user: Option<&'a str>,
        tenant: Option<&'a str>,
        statuses: &'a [&'a str],
        before_created_at: DateTime<Utc>,
        before_job_id: Uuid,
        limit: i64,
        service: Option<&'a str>,
    }
}

statement! {
    ListJobItems<'a> = "list_job_items" -> ItemDocument {
        job_id: Uuid,
        statuses: &'a [&'a str],
        first_step: i32,
        last_step: i32,
        after_id: i64,
        limit: i64,
    }
}

// Tenancy.

statement! {
    /// A row: the querier is new, and shards must be redrawn.
    JoinQuerier<'a> = "join_querier" -> () {
        querier: &'a str,
    }
}

statement! {
    TouchQuerier<'a> = "touch_querier" -> () {
        querier: &'a str,
        every_millis: i64,
    }
}

statement! {
    ShutDownQuerier<'a> = "shut_down_querier" -> () {
        querier: &'a str,
    }
}

statement! {
    NotifyQuerierShutDown<'a> = "notify_querier_shut_down" -> () {
        querier: &'a str,
    }
}

statement! {
    /// Forgets silent queriers and takes leaving ones out of their shards.
    RetireQueriers = "retire_queriers" -> Changed {
        forget_after_millis: i64,
    }
}

row! {
    Changed {
        changed: i64,
    }
}

statement! {
    /// Serialises every change of who serves which tenant.
    LockMembership = "lock_membership" -> () {}
}

statement! {
    ReshardTenants = "reshard_tenants" -> () {}
}

statement! {
    UpsertTenant<'a> = "upsert_tenant" -> () {
        tenant: &'a str,
        max_queriers: i32,
        max_outstanding: i32,
    }
}

statement! {
    /// Every tenant, or only `tenant`.
    ListTenants<'a> = "list_tenants" -> TenantDocument {
        tenant: Option<&'a str>,
    }
}

statement! {
    ListQueriers = "list_queriers" -> QuerierDocument {
        disconnected_after_millis: i64,
    }
}

statement! {
    LockIdleTenantQueues = "lock_idle_tenant_queues" -> TenantQueueKey {}
}

row! {
    TenantQueueKey {
        service: String,
        component: String,
        tenant: String,
    }
}

statement! {
    RetireTenantQueues<'a> = "retire_tenant_queues" -> () {
        services: &'a [String],
        components: &'a [String],
        tenants: &'a [String],
    }
}

statement! {
    RecountTenantRunning = "recount_tenant_running" -> () {}
}

// Maintenance and what operators read.

statement! {
    /// Takes the pruner's lock for the transaction, if no other transaction holds it.
    LockPruner = "lock_pruner" -> Locked {
        lock: i64,
    }
}

row! {
    Locked {
        locked: bool,
    }
}

statement! {
    FindPrunableJobs = "find_prunable_jobs" -> PrunableJob {
        retention_millis: i64,
        limit: i64,
    }
}

row! {
    PrunableJob {
        job_id: Uuid,
    }
}

statement! {
    PruneItems<'a> = "prune_items" -> Deleted {
        job_ids: &'a [Uuid],
        limit: i64,
    }
}

row! {
    Deleted {
        deleted: i64,
    }
}

statement! {
    /// Deletes a batch of expired Idempotency-Keys.
    PruneIdempotencyKeys = "prune_idempotency_keys" -> Deleted {
        limit: i64,
    }
}

statement! {
    /// Deletes those of the jobs that have no items left.
    PruneJobs<'a> = "prune_jobs" -> PrunedJobRow {
        job_ids: &'a [Uuid],
    }
}

row! {
    PrunedJobRow {
        job_id: Uuid,
        username: String,
        tenant: String,
        status: Stored<JobStatus>,
    }
}

statement! {
    VacuumFairOrder = "vacuum_fair_order" -> () {}
}

statement! {
    /// The database's gauges, taken at most once per `every_millis` however many brokers ask.
    RefreshMetrics = "refresh_metrics" -> Gauges {
        every_millis: i64,
    }
}

row! {
    Gauges {
        gauges: Json<Vec<GaugeRow>>,
    }
}

statement! {
    ItemCreationTimes<'a> = "item_creation_times" -> ItemCreated {
        ids: &'a [i64],
    }
}

statement! {
    /// Keeps, per service, the latest time a worker asked for its work.
    RecordServiceAsks<'a> = "record_service_asks" -> () {
        services: &'a [&'a str],
        asked_at: &'a [DateTime<Utc>],
    }
}

statement! {
    ListServiceAsks = "list_service_asks" -> ServiceAsked {}
}

row! {
    ServiceAsked {
        service: String,
        last_asked: DateTime<Utc>,
    }
}

row! {
    ItemCreated {
        id: i64,
        created_at: DateTime<Utc>,
    }
}

statement! {
    CheckConsistency = "check_consistency" -> Mismatch {}
}

statement! {
    /// The user_work table for operators, after the row keyed by the `after_` columns.
    ListUserWork<'a> = "list_user_work" -> UserWorkRow {
        service: Option<&'a str>,
        user: Option<&'a str>,
        limit: i64,
        after_user: Option<&'a str>,
        after_service: Option<&'a str>,
        after_job_id: Option<Uuid>,
        after_step: Option<i32>,
        after_component: Option<&'a str>,
    }
}

statement! {
    ListUserShares<'a> = "list_user_shares" -> UserShare {
        service: &'a str,
        limit: i64,
    }
}

statement! {
    StrategyUsageOf<'a> = "strategy_usage" -> StrategyUsage {
        service: &'a str,
        key: &'a str,
    }
}

statement! {
    /// Folds the logged changes of capped running counts into their rows.
    FoldStrategyRunning = "fold_strategy_running" -> () {}
}

// Tokens.

statement! {
    TokensExist = "tokens_exist" -> AnyToken {}
}

row! {
    AnyToken {
        exists: bool,
    }
}

statement! {
    /// The token of this SHA-256, revoked or expired ones too.
    FindToken<'a> = "find_token" -> TokenRow {
        hash: &'a [u8],
    }
}

statement! {
    /// A new token; no row when a live token has the name.
    InsertToken<'a> = "insert_token" -> TokenDocument {
        name: &'a str,
        role: &'a str,
        tenants: Option<&'a [String]>,
        services: Option<&'a [String]>,
        hash: &'a [u8],
        expires_in_millis: Option<i64>,
    }
}

statement! {
    ListTokens = "list_tokens" -> TokenDocument {}
}

statement! {
    RevokeToken = "revoke_token" -> TokenDocument {
        id: i64,
    }
}

statement! {
    TouchToken = "touch_token" -> () {
        id: i64,
    }
}

statement! {
    EnsureAdminToken<'a> = "ensure_admin_token" -> () {
        name: &'a str,
        hash: &'a [u8],
    }
}

// The server itself.

statement! {
    /// Whether the server is a standby, and which it is.
    ServerState = "server_state" -> ServerStateRow {}
}

row! {
    ServerStateRow {
        in_recovery: bool,
        host: String,
    }
}
