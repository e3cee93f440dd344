//! Jobs as producers see them: submitting, pausing, resuming, canceling and reading one.

pub mod bulk;
mod listing;
pub mod statements;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tracing::Instrument;
use uuid::Uuid;

use crate::core::Core;
use crate::counters::{
    self, apply_step_deltas, create_step_queues, StepDeltas, TenantDeltas, TenantRow,
};
use crate::db::sql;
use crate::error::BrokerError;
use crate::metrics::Finish;
use crate::rows::{self, JobRow};
use crate::traces;
use fairway_api::model::{
    reject_nul, ComponentName, JobDocument, JobId, JobStatus, NewItem, NewJob, StepDocument,
};
use fairway_api::traceparent::TraceParent;
use statements::{
    CancelJobItems, CanceledItems, CountOutstanding, CreateTenant, CreateUser, FindIdempotencyKey,
    GetJob, GetJobsSteps, InsertFirstStepItems, InsertJob, InsertJobMetadata, InsertJobSteps,
    JobTenant, JobTenantRow, LockJobOwner, LockTenantLimit, LockUser, NotifyJobFinished,
    Outstanding, RememberIdempotencyKey, ResumedService, RetriedItems, RetryJobItems, SetJobPaused,
    SetJobStatus, TenantLimit,
};
use tokio_postgres::types::Json;

/// An Idempotency-Key as a submission carries it.
pub struct IdempotencyKey {
    /// Whose key it is: `token:<id>` with auth, else `user:<the job's user>`.
    pub scope: String,
    pub key: String,
    /// SHA-256 of the request body's canonical JSON.
    pub digest: Vec<u8>,
}

impl IdempotencyKey {
    /// The key `key` of `scope` for a request whose body is `body`, compared by value: its
    /// digest is taken over serde_json's canonical form (object keys sorted), so that key
    /// order and spacing do not make two requests differ.
    pub fn new(scope: String, key: String, body: &Value) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(body.to_string().as_bytes()).to_vec();
        Self { scope, key, digest }
    }
}

/// What a submission did.
pub enum Submission {
    Created(JobId),
    /// The key's first request was the same: its answer, and nothing was stored.
    Replayed {
        job_id: JobId,
        response: Value,
    },
}

/// The answer to a submission that created `job_id`, as a key remembers it.
fn submitted(job_id: JobId) -> Value {
    serde_json::json!({ "job_id": job_id, "status": JobStatus::Accepted })
}

/// Jobs as producers see them: submitting, appending, pausing, resuming and canceling; and (in
/// `listing.rs`) their items, results and listings.
#[derive(Clone)]
pub struct Jobs {
    pub(crate) core: Arc<Core>,
}

impl Jobs {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

impl Jobs {
    /// Stores a job, its steps and its first step's items, all ready at once, or scheduled
    /// until the job's not_before. Refused, with nothing stored, when the items would take the
    /// tenant past its max_outstanding, or when its retry policy is invalid.
    pub async fn submit_job(&self, job: &NewJob) -> Result<JobId, BrokerError> {
        match self.submit_job_once_keyed(job, None).await? {
            Submission::Created(job_id) | Submission::Replayed { job_id, .. } => Ok(job_id),
        }
    }

    /// `submit_job`, remembering `key`: the same key with the same request again gets the
    /// first answer (`Submission::Replayed`) and stores nothing; with another request, 409
    /// `idempotency_key_reused`. A refused submission remembers nothing, so that it may be
    /// sent again with its key.
    pub async fn submit_job_keyed(
        &self,
        job: &NewJob,
        key: &IdempotencyKey,
    ) -> Result<Submission, BrokerError> {
        self.submit_job_once_keyed(job, Some(key)).await
    }

    async fn submit_job_once_keyed(
        &self,
        job: &NewJob,
        key: Option<&IdempotencyKey>,
    ) -> Result<Submission, BrokerError> {
        let span = tracing::info_span!(
            target: traces::TARGET,
            "submit",
            user = job.user.as_str(),
            tenant = job.tenant.as_str(),
            items = job.items.len(),
            service = %job.steps.iter().map(|step| step.service.as_str()).collect::<Vec<_>>().join(","),
        );
        self.core
            .retrying("submit_job", move || self.submit_job_once(job, key))
            .instrument(span)
            .await
    }

    async fn submit_job_once(
        &self,
        job: &NewJob,
        key: Option<&IdempotencyKey>,
    ) -> Result<Submission, BrokerError> {
        let job_id = JobId(Uuid::new_v4());
        let user = job.user.as_str();
        let tenant = job.tenant.as_str();
        let services: Vec<&str> = job.steps.iter().map(|step| step.service.as_str()).collect();
        let aggregates: Vec<bool> = job.steps.iter().map(|step| step.aggregate).collect();
        let retry = job.retry.as_ref().map(|spec| spec.resolve(&self.core.settings.retry_defaults));
        let retry = retry.transpose()?;

        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        if let Some(key) = key {
            // First, before the user's row: a concurrent request with the same key waits here
            // holding nothing, so this wait joins no cycle (docs/design.md, the lock order).
            if let Some(replay) = self.remember_key(&tx, key, job_id).await? {
                return Ok(replay);
            }
        }
        sql::run(&tx, &CreateUser { user }).await?;
        sql::fetch_opt(&tx, &LockUser { user }).await?;
        sql::run(&tx, &CreateTenant { tenant }).await?;
        admit(&tx, tenant, job.items.len()).await?;
        let insert = InsertJob {
            job_id: job_id.0,
            user,
            is_async: job.is_async,
            tenant,
            actor: job.actor.names(),
            priority: job.priority,
            retry_max_attempts: retry.map(|policy| policy.max_attempts as i32),
            retry_backoff: retry.map(|policy| policy.backoff.as_str()),
            retry_initial_ms: retry.map(|policy| sql::millis(policy.initial)),
            retry_max_ms: retry.map(|policy| sql::millis(policy.max)),
            not_before: job.not_before,
            traceparent: job.traceparent.as_ref().map(TraceParent::as_str),
        };
        sql::run(&tx, &insert).await?;
        let steps =
            InsertJobSteps { job_id: job_id.0, services: &services, aggregates: &aggregates };
        sql::run(&tx, &steps).await?;
        if !job.metadata.keys.is_empty() {
            let metadata = InsertJobMetadata {
                job_id: job_id.0,
                keys: &job.metadata.keys,
                values: &job.metadata.values,
                services: &services,
            };
            sql::run(&tx, &metadata).await?;
        }
        add_first_step_items(&tx, job_id, &job.items, job.not_before).await?;
        #[cfg(feature = "fault-injection")]
        self.core.faults.strike(crate::faults::Point::SubmitJob, &tx).await?;
        tx.commit().await?;
        Ok(Submission::Created(job_id))
    }

    /// Takes `key` for a submission that creates `job_id`; or, when the key is live already,
    /// its first answer (the same request) or 409 (another request).
    async fn remember_key(
        &self,
        tx: &impl GenericClient,
        key: &IdempotencyKey,
        job_id: JobId,
    ) -> Result<Option<Submission>, BrokerError> {
        let response = submitted(job_id);
        let ttl_millis =
            i64::try_from(self.core.settings.idempotency_ttl.as_millis()).unwrap_or(i64::MAX);
        let remember = RememberIdempotencyKey {
            scope: &key.scope,
            key: &key.key,
            request_digest: &key.digest,
            job_id: job_id.0,
            response: Json(&response),
            ttl_millis,
        };
        if sql::fetch_opt(tx, &remember).await?.is_some() {
            return Ok(None);
        }
        let find = FindIdempotencyKey { scope: &key.scope, key: &key.key };
        match sql::fetch_opt(tx, &find).await? {
            Some(first) if first.request_digest == key.digest => Ok(Some(Submission::Replayed {
                job_id: JobId(first.job_id),
                response: first.response.0,
            })),
            Some(_) => Err(BrokerError::conflict(
                "idempotency_key_reused",
                format!(
                    "Idempotency-Key {:?} was used with another request; use a new key for a \
                     new job",
                    key.key
                ),
            )),
            // It expired between the two statements: the request may simply be sent again.
            None => Err(BrokerError::conflict(
                "idempotency_key_expired",
                format!("Idempotency-Key {:?} expired just now; send the request again", key.key),
            )),
        }
    }

    /// Adds items to the first step of an unfinished job, for producers that discover work
    /// gradually: ready, or scheduled while the job's not_before is still to come. Refused
    /// once an aggregating step has its item: its inputs are final.
    pub async fn append_items(
        &self,
        job_id: JobId,
        items: &[NewItem],
    ) -> Result<JobDocument, BrokerError> {
        self.core.retrying("append_items", move || self.append_items_once(job_id, items)).await
    }

    async fn append_items_once(
        &self,
        job_id: JobId,
        items: &[NewItem],
    ) -> Result<JobDocument, BrokerError> {
        if items.is_empty() {
            return Err(BrokerError::invalid("invalid_items", "add at least one item"));
        }
        items.iter().try_for_each(|item| reject_nul(&item.payload, "a payload"))?;
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        let job = lock_unfinished_job(&tx, job_id, "add items to").await?;
        if job.steps.iter().any(|step| step.aggregate && step.total > 0) {
            return Err(BrokerError::conflict(
                "aggregation_started",
                format!("job {job_id} has already aggregated its results; it takes no new items"),
            ));
        }
        admit(&tx, &job.tenant, items.len()).await?;
        add_first_step_items(&tx, job_id, items, job.not_before).await?;
        let job = read_job(&tx, job_id).await?;
        tx.commit().await?;
        Ok(job)
    }

    pub async fn get_job(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        let client = self.core.client().await?;
        read_job(&client, job_id).await
    }

    /// Fails with the job's 404 unless the job exists and `allowed` says yes to its tenant:
    /// a token scoped to other tenants cannot tell another tenant's job from no job.
    pub async fn check_job_tenant(
        &self,
        job_id: JobId,
        allowed: impl Fn(&str) -> bool,
    ) -> Result<(), BrokerError> {
        let client = self.core.client().await?;
        match sql::fetch_opt(&client, &JobTenant { job_id: job_id.0 }).await? {
            Some(JobTenantRow { tenant }) if allowed(&tenant) => Ok(()),
            _ => Err(job_not_found(job_id)),
        }
    }

    /// Takes the job's ready items out of the fair order; running items finish as usual.
    pub async fn pause_job(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        self.core.retrying("pause_job", move || self.pause_job_once(job_id)).await
    }

    async fn pause_job_once(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        let job = lock_unfinished_job(&tx, job_id, "pause").await?;
        if job.status != JobStatus::Paused {
            sql::fetch_all(&tx, &SetJobPaused { job_id: job_id.0, paused: true }).await?;
            set_job_status(&tx, job_id, JobStatus::Paused).await?;
        }
        let job = read_job(&tx, job_id).await?;
        tx.commit().await?;
        Ok(job)
    }

    /// Puts a paused job's ready items back into the fair order.
    pub async fn resume_job(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        self.core.retrying("resume_job", move || self.resume_job_once(job_id)).await
    }

    async fn resume_job_once(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        let job = lock_unfinished_job(&tx, job_id, "resume").await?;
        if job.status == JobStatus::Paused {
            let resume = SetJobPaused { job_id: job_id.0, paused: false };
            for ResumedService { service } in sql::fetch_all(&tx, &resume).await? {
                counters::notify_work_ready(&tx, &service).await?;
            }
            let started = job
                .steps
                .iter()
                .any(|step| step.total > i64::from(step.ready) + i64::from(step.scheduled));
            let status = if started { JobStatus::Running } else { JobStatus::Accepted };
            set_job_status(&tx, job_id, status).await?;
        }
        let job = read_job(&tx, job_id).await?;
        tx.commit().await?;
        Ok(job)
    }

    /// Marks every unfinished item of the job canceled, scheduled ones too. Workers holding one get
    /// 409 on their next update. Canceling a canceled job again changes nothing.
    pub async fn cancel_job(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        self.core.retrying("cancel_job", move || self.cancel_job_once(job_id)).await
    }

    async fn cancel_job_once(&self, job_id: JobId) -> Result<JobDocument, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        lock_job_owner(&tx, job_id).await?;
        let job = read_job(&tx, job_id).await?;
        match job.status {
            JobStatus::Canceled => return Ok(job),
            status if status.is_finished() => return Err(job_finished(job_id, status, "cancel")),
            _ => {}
        }
        let mut tenant_deltas = TenantDeltas::default();
        let mut canceled = Vec::new();
        let canceled_items = sql::fetch_all(&tx, &CancelJobItems { job_id: job_id.0 }).await?;
        for CanceledItems { step_index: step, component, ready, scheduled, running } in
            canceled_items
        {
            let count = ready + scheduled + running;
            canceled.push((step, count));
            let deltas = StepDeltas {
                ready: -ready,
                scheduled: -scheduled,
                running: -running,
                canceled: count,
                ..Default::default()
            };
            let tenant_row = TenantRow::Later(&mut tenant_deltas);
            apply_step_deltas(&tx, job_id, step, &component, deltas, tenant_row).await?;
        }
        tenant_deltas.apply(&tx).await?;
        set_job_status(&tx, job_id, JobStatus::Canceled).await?;
        sql::run(&tx, &NotifyJobFinished { job_id: job_id.0 }).await?;
        let job = read_job(&tx, job_id).await?;
        tx.commit().await?;
        for (step, count) in canceled {
            let service = usize::try_from(step).ok().and_then(|step| job.steps.get(step));
            if let Some(step) = service {
                let count = u64::try_from(count).unwrap_or(0);
                self.core.metrics.finished(&step.service, &job.tenant, Finish::Canceled, count);
            }
        }
        Ok(job)
    }

    /// Puts every item of the job that failed for good back to ready at its next attempt,
    /// with a fresh retry budget, and makes the job run again (a paused job stays paused).
    /// Refused when nothing failed, for a canceled job, and when an aggregating step already
    /// ran over inputs that retried items would change: its result could not be taken back.
    pub async fn retry_job(&self, job_id: JobId) -> Result<RetriedJob, BrokerError> {
        self.core.retrying("retry_job", move || self.retry_job_once(job_id)).await
    }

    async fn retry_job_once(&self, job_id: JobId) -> Result<RetriedJob, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        // The owner first, as every change of a job's items (docs/design.md, the lock order).
        lock_job_owner(&tx, job_id).await?;
        let job = read_job(&tx, job_id).await?;
        if job.status == JobStatus::Canceled {
            return Err(BrokerError::conflict(
                "job_canceled",
                format!("cannot retry job {job_id}: it was canceled"),
            ));
        }
        if job.steps.iter().all(|step| step.failed == 0) {
            return Err(BrokerError::conflict(
                "nothing_to_retry",
                format!("job {job_id} has no failed items to retry"),
            ));
        }
        let aggregated_early = job.steps.iter().enumerate().any(|(index, step)| {
            step.aggregate
                && step.total > 0
                && job.steps[..index].iter().any(|earlier| earlier.failed > 0)
        });
        if aggregated_early {
            return Err(BrokerError::conflict(
                "aggregation_started",
                format!(
                    "cannot retry job {job_id}: an aggregating step already ran over the \
                     results of the items that failed; submit a new job instead"
                ),
            ));
        }
        // Retried items wait again, so they count against the tenant's max_outstanding as
        // submitted ones do; the tenant's row is taken after the owner's, as a submission does.
        let failed: usize =
            job.steps.iter().map(|step| usize::try_from(step.failed).unwrap_or(0)).sum();
        admit(&tx, &job.tenant, failed).await?;
        let mut tenant_deltas = TenantDeltas::default();
        let mut retried = 0i64;
        for RetriedItems { step_index: step, component, retried: count } in
            sql::fetch_all(&tx, &RetryJobItems { job_id: job_id.0 }).await?
        {
            retried += i64::from(count);
            let deltas = StepDeltas { ready: count, failed: -count, ..Default::default() };
            let tenant_row = TenantRow::Later(&mut tenant_deltas);
            apply_step_deltas(&tx, job_id, step, &component, deltas, tenant_row).await?;
        }
        tenant_deltas.apply(&tx).await?;
        if job.status != JobStatus::Paused {
            set_job_status(&tx, job_id, JobStatus::Running).await?;
        }
        let job = read_job(&tx, job_id).await?;
        tx.commit().await?;
        Ok(RetriedJob { job, retried })
    }
}

/// A job after `retry_job`, and how many of its items went back to ready.
#[derive(Debug, Clone)]
pub struct RetriedJob {
    pub job: JobDocument,
    pub retried: i64,
}

/// Refuses `count` new items when they would take the tenant past its max_outstanding. Holds
/// the tenant's row lock, when it has a limit, until the caller's transaction ends.
async fn admit(tx: &impl GenericClient, tenant: &str, count: usize) -> Result<(), BrokerError> {
    let Some(TenantLimit { max_outstanding: limit }) =
        sql::fetch_opt(tx, &LockTenantLimit { tenant }).await?
    else {
        return Ok(());
    };
    let Outstanding { outstanding } = sql::fetch_one(tx, &CountOutstanding { tenant }).await?;
    let wanted = outstanding.saturating_add(i64::try_from(count).unwrap_or(i64::MAX));
    if wanted > i64::from(limit) {
        return Err(BrokerError::TooManyOutstanding(format!(
            "tenant {tenant} has {outstanding} items waiting and a limit of {limit}; \
             {count} more would exceed it"
        )));
    }
    Ok(())
}

/// Adds `items` to step 0: scheduled until `not_before` while it is to come, else ready.
async fn add_first_step_items(
    tx: &impl GenericClient,
    job_id: JobId,
    items: &[NewItem],
    not_before: Option<DateTime<Utc>>,
) -> Result<(), BrokerError> {
    let not_before = not_before.filter(|time| *time > Utc::now());
    let mut per_component: BTreeMap<&ComponentName, i32> = BTreeMap::new();
    for item in items {
        let count = per_component.entry(&item.component).or_default();
        *count = count
            .checked_add(1)
            .ok_or_else(|| BrokerError::invalid("invalid_items", "too many items at once"))?;
    }
    let components: Vec<&str> = per_component.keys().map(|name| name.as_str()).collect();
    create_step_queues(tx, job_id, 0, &components).await?;
    let payloads: Vec<&Value> = items.iter().map(|item| &item.payload).collect();
    let item_components: Vec<&str> = items.iter().map(|item| item.component.as_str()).collect();
    let insert = InsertFirstStepItems {
        job_id: job_id.0,
        payloads: &payloads,
        components: &item_components,
        not_before,
    };
    sql::run(tx, &insert).await?;
    let mut tenant_deltas = TenantDeltas::default();
    let single = per_component.len() == 1;
    for (component, count) in per_component {
        let deltas = match not_before {
            Some(_) => StepDeltas { scheduled: count, ..Default::default() },
            None => StepDeltas { ready: count, ..Default::default() },
        };
        let tenant_row = if single { TenantRow::Now } else { TenantRow::Later(&mut tenant_deltas) };
        apply_step_deltas(tx, job_id, 0, component.as_str(), deltas, tenant_row).await?;
    }
    tenant_deltas.apply(tx).await
}

async fn lock_job_owner(tx: &impl GenericClient, job_id: JobId) -> Result<(), BrokerError> {
    match sql::fetch_opt(tx, &LockJobOwner { job_id: job_id.0 }).await? {
        Some(_) => Ok(()),
        None => Err(job_not_found(job_id)),
    }
}

async fn lock_unfinished_job(
    tx: &impl GenericClient,
    job_id: JobId,
    action: &str,
) -> Result<JobDocument, BrokerError> {
    lock_job_owner(tx, job_id).await?;
    let job = read_job(tx, job_id).await?;
    if job.status.is_finished() {
        return Err(job_finished(job_id, job.status, action));
    }
    Ok(job)
}

fn job_not_found(job_id: JobId) -> BrokerError {
    BrokerError::not_found("job_not_found", format!("no job {job_id}"))
}

fn job_finished(job_id: JobId, status: JobStatus, action: &str) -> BrokerError {
    BrokerError::conflict(
        "job_finished",
        format!("cannot {action} job {job_id}: it is already {}", status.as_str()),
    )
}

pub(super) async fn read_job(
    client: &impl GenericClient,
    job_id: JobId,
) -> Result<JobDocument, BrokerError> {
    let job = sql::fetch_opt(client, &GetJob { job_id: job_id.0 })
        .await?
        .ok_or_else(|| job_not_found(job_id))?;
    job_documents(client, vec![job]).await?.pop().ok_or_else(|| job_not_found(job_id))
}

/// The documents of `jobs`, their steps read at once.
pub(super) async fn job_documents(
    client: &impl GenericClient,
    jobs: Vec<JobRow>,
) -> Result<Vec<JobDocument>, BrokerError> {
    let ids: Vec<Uuid> = jobs.iter().map(|job| job.job_id).collect();
    let mut steps: HashMap<Uuid, Vec<StepDocument>> = HashMap::with_capacity(ids.len());
    for step in sql::fetch_all(client, &GetJobsSteps { job_ids: &ids }).await? {
        steps.entry(step.job_id).or_default().push(rows::step_document(step));
    }
    Ok(jobs
        .into_iter()
        .map(|job| {
            let job_steps = steps.remove(&job.job_id).unwrap_or_default();
            rows::job_document(job, job_steps)
        })
        .collect())
}

async fn set_job_status(
    tx: &impl GenericClient,
    job_id: JobId,
    status: JobStatus,
) -> Result<(), BrokerError> {
    sql::run(tx, &SetJobStatus { job_id: job_id.0, status: status.as_str() }).await?;
    Ok(())
}
