//! Ending attempts: workers' status reports and heartbeats, repeated reports, claims whose
//! answer reached no worker, and the reaper's expired leases, each batch in one transaction.

mod lanes;
mod outcome;
pub mod statements;

use std::collections::{BTreeSet, HashMap};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_postgres::types::Json;

use crate::batch::{answer_each, batch_index, in_batch};
use crate::core::Core;
use crate::db::sql::{self, Statement};
use crate::error::BrokerError;
use crate::metrics::{BatchKind, Deferral, Finish};
use crate::retry::unit_random;
use crate::rows::retry_policy;
use crate::tenancy::Tenancy;
use crate::traces;
use fairway_api::model::{reject_nul, ItemStatus, StatusUpdate, WorkItem, WorkItemId};
use lanes::EndingLanes;
use outcome::{record, refusal, AttemptEnding, Ending, Recorded, RetryBudget};
use statements::{
    DescribeItem, ExtendLease, FindExpiredLeases, FinishItems, FinishedRow, ItemRetryPolicies,
    ItemRetryPolicy,
};

/// An attempt that ended: its service, and whether the querier that held it is shutting down
/// (it may have released its last lease).
struct Ended {
    job_id: uuid::Uuid,
    service: String,
    tenant: String,
    status: ItemStatus,
    querier_leaving: bool,
    /// A released claim: not an attempt that ended, so not counted as one.
    released: bool,
    /// Handed back by its worker (also `released`).
    handed_back: bool,
}

/// How many times an ending goes back to the queue because another transaction held its
/// owner's row, before it waits for that row in a transaction of its own. With few users a
/// claim batch holds most of them most of the time, and each ending that waits alone costs a
/// transaction of its own.
const DEFERRALS: usize = 10;

/// Expired leases ended per transaction by the reaper: a dead worker pod's leases come back in
/// a few transactions rather than one each, while the owners' rows a transaction waits for and
/// holds stay few.
const REAP_CHUNK: usize = 32;

/// Longest a deferred ending waits for a claim batch of this broker to commit before it goes
/// again: the holder may be another broker's.
const DEFERRAL_PAUSE: Duration = Duration::from_millis(5);

/// What a batch did with one ending.
pub(super) enum Answer {
    /// Applied: the item's status now.
    Applied(ItemStatus),
    /// Another transaction held the owner's row: nothing changed; send it again.
    Deferred,
    /// The same report had already been applied (its sender never got the answer): nothing
    /// changed; the item's status as that ending left it.
    Repeated(ItemStatus),
}

/// Whether a batch waits for owners' rows other transactions hold, or leaves those endings
/// for a later batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owners {
    Wait,
    SkipHeld,
}

/// Whether an ending applies to any running attempt, or only to one whose lease has expired.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LeaseCondition {
    Any,
    Expired,
}

/// Ends attempts: each report waits in a group-commit batch with those that arrive meanwhile,
/// and one transaction applies them, moves the counters and grows the workflows.
#[derive(Clone)]
pub struct Endings {
    core: Arc<Core>,
    lanes: Arc<EndingLanes>,
    /// Notified when a claim batch of this broker commits: a deferred ending goes again then.
    claims_committed: Arc<Notify>,
    /// A querier that is shutting down leaves its shards once its last lease ends.
    tenancy: Tenancy,
}

impl Endings {
    /// `lanes` batches run at once, each of at most `most` reports.
    pub(crate) fn new(
        core: Arc<Core>,
        (lanes, most): (usize, usize),
        claims_committed: Arc<Notify>,
        tenancy: Tenancy,
    ) -> Self {
        let lanes = Arc::new(EndingLanes::new(lanes, most));
        Self { core, lanes, claims_committed, tenancy }
    }

    /// Remembers who owns an item this broker hands out, so that its ending goes to its
    /// owner's lane.
    pub(crate) fn note_owner(&self, item: WorkItemId, owner: &str) {
        self.lanes.note_owner(item, owner);
    }
}

impl Endings {
    /// Applies a worker's report on the attempt it holds, and returns the item's status after
    /// it. A stale attempt or a finished item is a conflict and changes nothing.
    ///
    /// Reports that end attempts are written together with the others that arrive meanwhile,
    /// in one transaction; the answer comes once it committed.
    ///
    /// With `token`, the report applies only to an attempt that token claimed: another
    /// token's attempt is refused (forbidden) and changes nothing. None: whoever claimed it.
    pub async fn update_status(
        &self,
        id: WorkItemId,
        attempt: i32,
        update: StatusUpdate,
        token: Option<i64>,
    ) -> Result<ItemStatus, BrokerError> {
        let ending = match update {
            StatusUpdate::Running => {
                self.heartbeat(id, attempt, token).await?;
                return Ok(ItemStatus::Running);
            }
            StatusUpdate::Successful { results, component, warning } => {
                results.iter().try_for_each(|result| reject_nul(result, "a result"))?;
                if let Some(warning) = &warning {
                    reject_nul(&Value::String(warning.clone()), "a warning")?;
                }
                Ending::Successful { results, component, warning }
            }
            StatusUpdate::Failed { error, retryable } => {
                if let Some(error) = &error {
                    reject_nul(&Value::String(error.clone()), "an error")?;
                }
                Ending::Failed { error, retryable }
            }
            StatusUpdate::Released { reason } => {
                if let Some(reason) = &reason {
                    reject_nul(&Value::String(reason.clone()), "a reason")?;
                }
                Ending::HandedBack { reason }
            }
        };
        let ending = AttemptEnding { id, attempt, ending, token };
        let lane = self.lanes.lane_of(id);
        // A batch does not wait for an owner's row another transaction holds (a claim batch,
        // mostly); the ending goes again with a later batch, and after a few tries alone.
        for _ in 0..DEFERRALS {
            // Registered before the batch goes, so that a claim batch committing meanwhile
            // counts.
            let mut claims_committed = pin!(self.claims_committed.notified());
            claims_committed.as_mut().enable();
            let answer =
                in_batch(self, lane, ending.clone(), Self::end_in_batch, Self::unread_endings);
            match answer.await? {
                Answer::Applied(status) | Answer::Repeated(status) => return Ok(status),
                // Going again at once would find the row still held, as often as not: go once
                // this broker's claim batch has let go of its rows, or after a pause when the
                // holder is elsewhere.
                Answer::Deferred => {
                    self.core.metrics.ending_deferred(Deferral::SentAgain);
                    let _ = tokio::time::timeout(DEFERRAL_PAUSE, claims_committed).await;
                }
            }
        }
        self.core.metrics.ending_deferred(Deferral::Waited);
        let mut answers = self.end_batch(&[ending], LeaseCondition::Any, Owners::Wait).await?;
        match answers.pop().unwrap_or(Err(BrokerError::BatchLost))? {
            Answer::Applied(status) | Answer::Repeated(status) => Ok(status),
            Answer::Deferred => Err(BrokerError::BatchLost),
        }
    }

    /// Endings whose workers left before the answer: applied all the same (a worker that sends
    /// its report again gets the same answer), so nothing is left to do.
    async fn unread_endings(self, _: Vec<Result<Answer, BrokerError>>) {}

    /// Claims whose long polls left before the answer (the client closed its connection while
    /// the claim's batch ran): nobody will work on their items, so they go back to ready at
    /// once, as if never claimed (the attempt not counted), rather than wait out their lease.
    pub(super) async fn release_unanswered(&self, items: Vec<WorkItem>) {
        let endings: Vec<AttemptEnding> = items
            .iter()
            .map(|item| AttemptEnding {
                id: item.id,
                attempt: item.attempt,
                ending: Ending::Released,
                token: None,
            })
            .collect();
        match self.end_batch(&endings, LeaseCondition::Any, Owners::Wait).await {
            Ok(answers) => {
                // An item settled meanwhile (its job canceled) holds no lease any more.
                for (item, answer) in items.iter().zip(answers) {
                    if let Ok(Answer::Applied(_)) = answer {
                        tracing::info!(
                            item = item.id.0,
                            attempt = item.attempt,
                            "released an unanswered claim"
                        );
                        self.core.metrics.claim_released(&item.service);
                    }
                }
            }
            Err(error) => {
                let items = items.len();
                tracing::warn!(%error, items, "releasing unanswered claims; their leases end them");
            }
        }
    }

    /// A heartbeat: extends the lease of the attempt, and answers when it now ends. It touches
    /// no counter, so it needs no user lock and no batch.
    pub async fn heartbeat(
        &self,
        id: WorkItemId,
        attempt: i32,
        token: Option<i64>,
    ) -> Result<DateTime<Utc>, BrokerError> {
        let client = self.core.client().await?;
        let lease = self.core.lease_millis();
        let extend = ExtendLease { id: id.0, attempt, lease_millis: lease, token };
        match sql::fetch_opt(&client, &extend).await? {
            Some(extended) => Ok(extended.lease_expires_at),
            None => Err(why_not_applied(&client, id, attempt, token).await?),
        }
    }

    /// Ends the attempts of a batch in one transaction.
    async fn end_in_batch(self, endings: Vec<AttemptEnding>) -> Vec<Result<Answer, BrokerError>> {
        self.core.metrics.batch(BatchKind::Ending, endings.len());
        answer_each(&endings, |batch| self.end_batch(batch, LeaseCondition::Any, Owners::SkipHeld))
            .await
    }

    /// Treats every expired lease (up to `limit`) as a retryable failure, [`REAP_CHUNK`] to a
    /// transaction. Safe to run in several brokers at once: an item another reaper or its
    /// worker settled first is left alone. Returns how many leases it expired.
    pub(crate) async fn reap_expired_leases(&self, limit: i64) -> Result<usize, BrokerError> {
        let expired = {
            let client = self.core.client().await?;
            sql::fetch_all(&client, &FindExpiredLeases { limit }).await?
        };
        let endings: Vec<AttemptEnding> = expired
            .into_iter()
            .map(|lease| AttemptEnding {
                id: WorkItemId(lease.id),
                attempt: lease.attempt,
                ending: Ending::Expired,
                token: None,
            })
            .collect();
        let mut reaped = 0;
        for chunk in endings.chunks(REAP_CHUNK) {
            let answers = self.end_batch(chunk, LeaseCondition::Expired, Owners::Wait).await?;
            reaped +=
                answers.iter().filter(|answer| matches!(answer, Ok(Answer::Applied(_)))).count();
        }
        Ok(reaped)
    }

    /// finish_items locks the owners' users rows first, in the one order all transactions use
    /// (with `Owners::SkipHeld` only those free now), then ends the attempts, moves each
    /// counter row once, grows the workflows and finishes the jobs left with nothing open; the
    /// tenant rows come last, in key order. Every batch is that one statement, in one round
    /// trip, its own transaction. Answers each ending: its item's status, deferred, or why it
    /// did not apply.
    ///
    /// A run that deadlocks runs again whole, for every ending of the batch (see `retry`):
    /// nothing is answered, signalled or counted before a run commits.
    async fn end_batch(
        &self,
        endings: &[AttemptEnding],
        condition: LeaseCondition,
        owners: Owners,
    ) -> Result<Vec<Result<Answer, BrokerError>>, BrokerError> {
        let operation = match condition {
            LeaseCondition::Any => "end_attempts",
            LeaseCondition::Expired => "expire_leases",
        };
        let span = tracing::info_span!(
            target: traces::TARGET,
            "ending batch",
            batch_size = endings.len(),
            operation,
            service = tracing::field::Empty,
        );
        let span = &span;
        self.core
            .retrying(operation, || self.end_batch_once(endings, condition, owners, span))
            .await
    }

    async fn end_batch_once(
        &self,
        endings: &[AttemptEnding],
        condition: LeaseCondition,
        owners: Owners,
        span: &tracing::Span,
    ) -> Result<Vec<Result<Answer, BrokerError>>, BrokerError> {
        let client = self.core.client().await?;
        // Prepared before anything is sent, so that the pipelined requests below go out in
        // the order they are written.
        let finish_items = client.prepare_cached(FinishItems::SQL).await?;
        let ids: Vec<i64> = endings.iter().map(|ending| ending.id.0).collect();
        let budgets = retry_budgets(&client, endings).await?;
        let recorded: Vec<Recorded> = endings
            .iter()
            .map(|ending| {
                let budget = budgets.get(&ending.id.0);
                record(ending, budget, self.core.settings.max_retries, unit_random())
            })
            .collect();
        let attempts: Vec<i32> = endings.iter().map(|ending| ending.attempt).collect();
        let statuses: Vec<&str> = recorded.iter().map(|r| r.status.as_str()).collect();
        let results: Vec<Option<Json<&Vec<Value>>>> =
            recorded.iter().map(|r| r.results.map(Json)).collect();
        let errors: Vec<Option<&str>> = recorded.iter().map(|r| r.error).collect();
        let next_components: Vec<Option<&str>> =
            recorded.iter().map(|r| r.next_component).collect();
        let digests: Vec<Option<&[u8]>> = recorded.iter().map(|r| r.digest.as_deref()).collect();
        let uncounted: Vec<bool> = recorded.iter().map(|r| r.uncounted).collect();
        let handed_back: Vec<bool> = recorded.iter().map(|r| r.handed_back).collect();
        let warnings: Vec<Option<&str>> = recorded.iter().map(|r| r.warning).collect();
        let delays_millis: Vec<Option<i64>> = recorded.iter().map(|r| r.delay_millis).collect();
        let tokens: Vec<Option<i64>> = endings.iter().map(|ending| ending.token).collect();
        let finish = FinishItems {
            ids: &ids,
            attempts: &attempts,
            statuses: &statuses,
            results: &results,
            errors: &errors,
            next_components: &next_components,
            digests: &digests,
            uncounted: &uncounted,
            expired_only: condition == LeaseCondition::Expired,
            wait_for_owners: owners == Owners::Wait,
            tokens: &tokens,
            delays_millis: &delays_millis,
            handed_back: &handed_back,
            warnings: &warnings,
        };
        let params = finish.params();
        // A test's forced deadlock needs a transaction to strike in: the same statement, in
        // a transaction that the fault then rolls back.
        #[cfg(feature = "fault-injection")]
        let rows = if self.core.faults.armed(crate::faults::Point::EndAttempts) > 0 {
            client.batch_execute("BEGIN").await?;
            let struck = async {
                let rows = client.query(&finish_items, &params).await?;
                self.core.faults.strike(crate::faults::Point::EndAttempts, &client).await?;
                Ok::<_, BrokerError>(rows)
            }
            .await;
            let end = if struck.is_ok() { "COMMIT" } else { "ROLLBACK" };
            client.batch_execute(end).await?;
            struck?
        } else {
            client.query(&finish_items, &params).await?
        };
        #[cfg(not(feature = "fault-injection"))]
        let rows = client.query(&finish_items, &params).await?;
        let finished = sql::decode::<FinishedRow>(&rows)?;
        let (answers, released) =
            self.answer_endings(&client, endings, &recorded, &finished, condition).await?;
        self.after_commit(&client, span, &released, condition).await;
        Ok(answers)
    }

    /// Once a batch of endings committed: wakes a claim waiting for a busy user per item
    /// released, counts the endings, and lets a querier that is shutting down leave its shards
    /// once it holds no lease. What follows a commit must not turn the endings into errors.
    async fn after_commit(
        &self,
        client: &impl GenericClient,
        span: &tracing::Span,
        released: &[Ended],
        condition: LeaseCondition,
    ) {
        for ended in released {
            self.core.signals.for_service(&ended.service).release_one();
            if ended.handed_back {
                self.core.metrics.item_released(&ended.service);
            }
            if ended.released {
                continue;
            }
            let finish = match ended.status {
                ItemStatus::Ready | ItemStatus::Scheduled => Finish::Retried,
                ItemStatus::Failed => Finish::Failed,
                _ => Finish::Successful,
            };
            self.core.metrics.finished(&ended.service, &ended.tenant, finish, 1);
            if condition == LeaseCondition::Expired {
                self.core.metrics.lease_expired(&ended.service);
            }
        }
        if released.iter().any(|ended| ended.querier_leaving) {
            if let Err(error) = self.tenancy.retire_queriers().await {
                tracing::warn!(%error, "retiring queriers after their leases ended");
            }
        }
        if !span.is_disabled() {
            trace_batch(client, span, released).await;
        }
    }

    /// After finish_items (`finished`, its rows): explains each ending that did not apply.
    /// Returns the answers and the attempts that ended.
    async fn answer_endings(
        &self,
        client: &impl GenericClient,
        endings: &[AttemptEnding],
        recorded: &[Recorded<'_>],
        finished: &[FinishedRow],
        condition: LeaseCondition,
    ) -> Result<(Vec<Result<Answer, BrokerError>>, Vec<Ended>), BrokerError> {
        let mut outcomes: Vec<Option<Result<Answer, BrokerError>>> =
            endings.iter().map(|_| None).collect();
        let mut released = Vec::with_capacity(finished.len());
        for row in finished {
            let index = batch_index(row.ending, endings.len())?;
            let Some(applied) = &row.applied else {
                outcomes[index] = Some(Ok(Answer::Deferred));
                continue;
            };
            let status = recorded[index].status;
            released.push(Ended {
                job_id: applied.job_id,
                service: applied.service.clone(),
                tenant: applied.tenant.clone(),
                status,
                querier_leaving: applied.querier_leaving,
                released: recorded[index].uncounted || recorded[index].handed_back,
                handed_back: recorded[index].handed_back,
            });
            outcomes[index] = Some(Ok(Answer::Applied(status)));
        }
        let mut answers = Vec::with_capacity(endings.len());
        for (outcome, ending) in outcomes.into_iter().zip(endings) {
            answers.push(match outcome {
                Some(outcome) => outcome,
                // The reaper needs no reason: a lease another reaper or its worker ended first
                // is simply not its to end, and reading each such item would cost a round trip
                // per lease when reapers race over a dead node's leases.
                None if condition == LeaseCondition::Expired => Err(lease_settled(ending.id)),
                None => unapplied(client, ending).await?,
            });
        }
        Ok((answers, released))
    }
}

/// The retry budgets of the endings that may retry (retryable failures and expired leases),
/// by item id; the others (successes, mostly) need none, and a batch of them pays no read.
async fn retry_budgets(
    client: &impl GenericClient,
    endings: &[AttemptEnding],
) -> Result<HashMap<i64, RetryBudget>, BrokerError> {
    let may_retry: Vec<i64> = endings
        .iter()
        .filter(|ending| {
            matches!(ending.ending, Ending::Failed { retryable: true, .. } | Ending::Expired)
        })
        .map(|ending| ending.id.0)
        .collect();
    if may_retry.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sql::fetch_all(client, &ItemRetryPolicies { ids: &may_retry }).await?;
    Ok(rows
        .into_iter()
        .map(|row: ItemRetryPolicy| {
            let policy = retry_policy(
                row.retry_max_attempts,
                row.retry_backoff.as_deref(),
                row.retry_initial_ms,
                row.retry_max_ms,
            );
            (row.id, RetryBudget { base: row.retry_base, policy })
        })
        .collect())
}

/// An expired lease the reaper found already ended by someone else.
fn lease_settled(id: WorkItemId) -> BrokerError {
    BrokerError::conflict("stale_attempt", format!("work item {id} no longer holds that lease"))
}

fn item_not_found(id: WorkItemId) -> BrokerError {
    BrokerError::not_found("work_item_not_found", format!("no work item {id}"))
}

/// Explains why an update naming `attempt` of item `id`, sent with `token`, did not apply.
async fn why_not_applied(
    client: &impl GenericClient,
    id: WorkItemId,
    attempt: i32,
    token: Option<i64>,
) -> Result<BrokerError, BrokerError> {
    match sql::fetch_opt(client, &DescribeItem { id: id.0 }).await? {
        Some(item) => Ok(refusal(&item, id, attempt, token)),
        None => Ok(item_not_found(id)),
    }
}

/// An ending that did not apply: when its report is the one the item's latest ending recorded
/// (the same item, attempt, status and results or error, sent again by a worker that never got
/// the answer), that ending's answer; otherwise why not.
async fn unapplied(
    client: &impl GenericClient,
    ending: &AttemptEnding,
) -> Result<Result<Answer, BrokerError>, BrokerError> {
    let Some(item) = sql::fetch_opt(client, &DescribeItem { id: ending.id.0 }).await? else {
        return Ok(Err(item_not_found(ending.id)));
    };
    if let (Some(digest), Some(recorded), Some(ended_as)) =
        (ending.digest(), &item.ending_digest, &item.ended_as)
    {
        if *recorded == digest {
            return Ok(Ok(Answer::Repeated(ended_as.0)));
        }
    }
    Ok(Err(refusal(&item, ending.id, ending.attempt, ending.token)))
}

/// Names the services of an ending batch that committed on its span, and has it continue its
/// jobs' traces. Only while traces are exported: it costs a statement, and a failure costs
/// only the span's parent.
async fn trace_batch(client: &impl GenericClient, span: &tracing::Span, ended: &[Ended]) {
    let services: BTreeSet<&str> = ended.iter().map(|ended| ended.service.as_str()).collect();
    span.record("service", services.into_iter().collect::<Vec<_>>().join(","));
    let mut job_ids: Vec<uuid::Uuid> = ended.iter().map(|ended| ended.job_id).collect();
    job_ids.sort_unstable();
    job_ids.dedup();
    match traces::job_traceparents(client, &job_ids).await {
        Ok(traceparents) => {
            traces::continue_traces(span, traceparents.values().map(String::as_str))
        }
        Err(error) => tracing::warn!(%error, "reading the traceparents of ended items' jobs"),
    }
}
