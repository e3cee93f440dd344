//! Handing out work: claim batches chosen by the fair order (or a worker's strategy) in one
//! transaction each, and the long polls that wait for work to appear.

pub(crate) mod asks;
pub mod statements;

use std::collections::{BTreeSet, HashSet};
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::batch::{answer_each, batch_index, in_batch, KeyedBatches};
use crate::core::Core;
use crate::db::sql;
use crate::endings::Endings;
use crate::error::BrokerError;
use crate::metrics::{ClaimOutcome, ClaimedItem};
use crate::tenancy::Tenancy;
use crate::traces;
use asks::ServiceAsks;
use fairway_api::model::{ClaimRequest, ServiceName, WorkItem};
use fairway_api::strategy::{ends_in_fair, has_hard_cap};
use statements::{ClaimItems, HasClaimableWork, ServiceIsNamed};

/// How long a claim that found every user with work busy waits for a release signalled in
/// this process before it looks again anyway (other brokers' releases are not signalled here).
const RELEASE_POLL: Duration = Duration::from_millis(50);

/// How often a long poll under a hard cap looks again: capacity freed by an ending is not
/// notified (see `sql/counters/log_strategy_running.sql`).
const CAPPED_POLL: Duration = Duration::from_millis(200);

/// How long a claim keeps waiting for busy users before it reports no work.
const CONTENDED_LIMIT: Duration = Duration::from_secs(5);

/// What one look for work found.
pub enum Look {
    Claimed(Vec<WorkItem>),
    /// Work exists, but every user who has it is held by another transaction right now.
    Contended,
    Nothing,
    /// The querier has not joined yet: nothing was looked at.
    NotMember,
    /// The service's policy allows no more items now: its cap is reached, or its rate limit's
    /// next item is due in the given time.
    Limited(Limit),
}

/// Which of a service's policies held a claim back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// As many of its items run as `max_running` allows: a slot frees with an ending.
    Cap,
    /// The rate limit's next item is due after this long.
    Rate(Duration),
}

impl Limit {
    fn from_row(limited: Option<&str>, retry_ms: Option<i64>) -> Option<Self> {
        match limited? {
            "rate" => Some(Limit::Rate(Duration::from_millis(
                retry_ms.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(1),
            ))),
            _ => Some(Limit::Cap),
        }
    }

    /// Why only users at their cap or out of tokens have work: the first of them due then,
    /// if any is rate-limited, else a cap.
    fn held_users(throttled_until: Option<chrono::DateTime<chrono::Utc>>) -> Self {
        match throttled_until {
            Some(due) => Limit::Rate(
                (due - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default()
                    .max(Duration::from_millis(1)),
            ),
            None => Limit::Cap,
        }
    }

    /// The label of `fairway_claims_passed_over_total`.
    fn reason(self) -> &'static str {
        match self {
            Limit::Cap => "cap",
            Limit::Rate(_) => "rate",
        }
    }
}

/// Hands out work: each claim waits in a group-commit batch with the claims that arrive
/// meanwhile, and one transaction chooses every item of the batch by the fair order.
#[derive(Clone)]
pub struct Claims {
    core: Arc<Core>,
    /// A queue per service: the claim order is per service, so claims for one service take
    /// turns on its head, while other services' go on beside them.
    batches: Arc<KeyedBatches<ClaimRequest, Result<Look, BrokerError>>>,
    /// Notified when a claim batch of this broker commits: the users rows it held are free.
    committed: Arc<Notify>,
    endings: Endings,
    tenancy: Tenancy,
    /// Services some job has named, as this broker has seen: a service stays named (its
    /// tenant_queues rows are never deleted), so an empty answer asks the database once.
    named: Arc<Mutex<HashSet<String>>>,
    /// When workers last asked for each service, as this broker saw them.
    asks: Arc<ServiceAsks>,
}

impl Claims {
    pub(crate) fn new(
        core: Arc<Core>,
        batches: KeyedBatches<ClaimRequest, Result<Look, BrokerError>>,
        committed: Arc<Notify>,
        endings: Endings,
        tenancy: Tenancy,
    ) -> Self {
        let (named, asks) = (Arc::default(), Arc::default());
        let batches = Arc::new(batches);
        Self { core, batches, committed, endings, tenancy, named, asks }
    }
}

impl Claims {
    /// Whether any job has named `service`: a claim for one that none has waits like an idle
    /// service's, so the server tells the worker it may be a typo.
    pub async fn service_is_named(&self, service: &ServiceName) -> Result<bool, BrokerError> {
        let known = |named: &HashSet<String>| named.contains(service.as_str());
        if known(&self.named.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(true);
        }
        let client = self.core.client().await?;
        let named =
            sql::fetch_one(&client, &ServiceIsNamed { service: service.as_str() }).await?.named;
        if named {
            let mut seen = self.named.lock().unwrap_or_else(PoisonError::into_inner);
            seen.insert(service.as_str().to_owned());
        }
        Ok(named)
    }

    /// Hands out up to `request.max` work items of the service in one transaction, each chosen
    /// by the fair order as a single claim would choose it. Empty when nothing is ready.
    ///
    /// When every user with work is being served by other claims (a lone user and many workers),
    /// the claim waits here for one of them to be released rather than answer "no work", and
    /// rather than queue inside PostgreSQL on a row lock while holding a connection.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Vec<WorkItem>, BrokerError> {
        Ok(self.claim_within_policy(request).await?.0)
    }

    /// As [`Claims::claim`], and when the service's policy held the claim back, which limit.
    async fn claim_within_policy(
        &self,
        request: &ClaimRequest,
    ) -> Result<(Vec<WorkItem>, Option<Limit>), BrokerError> {
        let signal = self.core.signals.for_service(request.service.as_str());
        let deadline = Instant::now() + CONTENDED_LIMIT;
        loop {
            if self.core.is_draining() {
                return Ok((Vec::new(), None));
            }
            let mut released = pin!(signal.released());
            released.as_mut().enable();
            match self.look_for_work(request).await? {
                Look::Claimed(items) => {
                    signal.release_one();
                    return Ok((items, None));
                }
                Look::Nothing => return Ok((Vec::new(), None)),
                Look::Limited(limit) => return Ok((Vec::new(), Some(limit))),
                Look::NotMember => self.tenancy.join_querier(request.querier.as_str()).await?,
                Look::Contended if Instant::now() >= deadline => return Ok((Vec::new(), None)),
                Look::Contended => {
                    let _ = tokio::time::timeout(RELEASE_POLL, released).await;
                }
            }
        }
    }

    /// One look, made together with the looks of other workers that arrive meanwhile.
    async fn look_for_work(&self, request: &ClaimRequest) -> Result<Look, BrokerError> {
        let queue = self.batches.queue(request.service.as_str());
        in_batch(self, &queue, request.clone(), Self::look_in_batch, Self::unread_looks).await
    }

    /// Looks whose callers left while their batch ran: the items they claimed go back.
    async fn unread_looks(self, looks: Vec<Result<Look, BrokerError>>) {
        let items: Vec<WorkItem> = looks
            .into_iter()
            .filter_map(|look| match look {
                Ok(Look::Claimed(items)) => Some(items),
                _ => None,
            })
            .flatten()
            .collect();
        if !items.is_empty() {
            self.endings.release_unanswered(items).await;
        }
    }

    /// Looks for work for every request of a batch in one transaction.
    async fn look_in_batch(self, requests: Vec<ClaimRequest>) -> Vec<Result<Look, BrokerError>> {
        if self.core.is_draining() {
            return requests.iter().map(|_| Ok(Look::Nothing)).collect();
        }
        let started = Instant::now();
        let span = tracing::info_span!(
            target: traces::TARGET,
            "claim batch",
            batch_size = requests.len(),
            service = %services_of(&requests),
            items = tracing::field::Empty,
        );
        let broker = &self;
        let looks = answer_each(&requests, |batch| {
            // The claim commits in its one statement, before anything else can fail: a run
            // that failed claimed nothing, and the batch runs again whole.
            broker.core.retrying("claim", move || broker.claim_batch(batch))
        })
        .await;
        self.core.metrics.claim_batch(requests.len(), started.elapsed());
        // The batch continues the traces of the jobs it handed out items of.
        let claimed = looks.iter().filter_map(|look| match look {
            Ok(Look::Claimed(items)) => Some(items),
            _ => None,
        });
        let items = claimed.flatten();
        span.record("items", items.clone().count());
        traces::continue_traces(&span, items.filter_map(|item| item.traceparent.as_deref()));
        looks
    }

    /// One statement, so one transaction, for the whole batch; then, for each request that got
    /// nothing, whether it lost a race (work exists) or there is nothing for it.
    async fn claim_batch(
        &self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<Result<Look, BrokerError>>, BrokerError> {
        let client = self.core.client().await?;
        let services: Vec<&str> = requests.iter().map(|r| r.service.as_str()).collect();
        let queriers: Vec<&str> = requests.iter().map(|r| r.querier.as_str()).collect();
        let workers: Vec<i32> = requests.iter().map(|r| r.worker).collect();
        let maxes: Vec<i32> =
            requests.iter().map(|r| i32::try_from(r.max).unwrap_or(i32::MAX)).collect();
        let strategies: Vec<Option<&Value>> =
            requests.iter().map(|r| r.strategy.as_deref()).collect();
        let tokens: Vec<Option<i64>> = requests.iter().map(|r| r.token).collect();
        let (lease, touch_every) = (self.core.claim_lease_millis(), self.core.touch_every_millis());
        let mut items: Vec<Vec<WorkItem>> = requests.iter().map(|_| Vec::new()).collect();
        let mut states: Vec<Option<String>> = vec![None; requests.len()];
        let mut passed_over = vec![false; requests.len()];
        let mut limits: Vec<Option<Limit>> = vec![None; requests.len()];
        let claim = ClaimItems {
            services: &services,
            queriers: &queriers,
            workers: &workers,
            maxes: &maxes,
            lease_millis: lease,
            touch_every_millis: touch_every,
            strategies: &strategies,
            tokens: &tokens,
        };
        let claimed = sql::fetch_all(&client, &claim).await?;
        self.committed.notify_waiters();
        #[cfg(feature = "fault-injection")]
        self.core.faults.pause(crate::faults::Point::ClaimCommitted).await;
        let lease = chrono::Duration::milliseconds(lease);
        for row in claimed {
            let request = batch_index(row.request, requests.len())?;
            states[request] = row.querier_state.clone();
            let passed = row.passed_over == Some(true);
            limits[request] = Limit::from_row(row.limited.as_deref(), row.retry_ms);
            match row.into_work_item(services[request])? {
                Some(item) => {
                    self.endings.note_owner(item.id, &item.user);
                    items[request].push(item);
                }
                None => passed_over[request] = passed,
            }
        }
        // Only a first attempt is known to have waited since its creation; a retry's wait
        // began when its previous attempt ended, which the item does not keep.
        self.core.metrics.claimed(items.iter().flatten().filter(|item| item.attempt == 1).map(
            |item| ClaimedItem {
                id: item.id.0,
                service: item.service.clone(),
                tenant: item.tenant.clone(),
                claimed_at: item.lease_expires_at - lease,
            },
        ));
        let mut looks = Vec::with_capacity(requests.len());
        for ((((request, items), state), passed_over), limit) in
            requests.iter().zip(items).zip(states).zip(passed_over).zip(limits)
        {
            if let (true, Some("active"), Some(limit)) = (items.is_empty(), state.as_deref(), limit)
            {
                self.core.metrics.passed_over(limit.reason());
                looks.push(Ok(Look::Limited(limit)));
                continue;
            }
            looks.push(match state.as_deref() {
                _ if !items.is_empty() => Ok(Look::Claimed(items)),
                None => Ok(Look::NotMember),
                Some("shutting_down") => {
                    Err(BrokerError::QuerierShuttingDown(request.querier.as_str().to_owned()))
                }
                // A strategy that never reaches the fair order knows whether it passed over
                // held work; work it filtered out or capped is not work for it.
                Some(_) if request.strategy.as_deref().is_some_and(|s| !ends_in_fair(s)) => {
                    Ok(if passed_over { Look::Contended } else { Look::Nothing })
                }
                // The batch has committed: an error from here on is this request's alone.
                Some(_) => {
                    let has_work = HasClaimableWork {
                        service: request.service.as_str(),
                        querier: request.querier.as_str(),
                    };
                    match sql::fetch_opt(&client, &has_work).await {
                        Ok(Some(work)) if work.in_order => Ok(Look::Contended),
                        Ok(Some(work)) => {
                            let limit = Limit::held_users(work.throttled_until);
                            self.core.metrics.passed_over(limit.reason());
                            Ok(Look::Limited(limit))
                        }
                        Ok(None) => Ok(Look::Nothing),
                        Err(error) => Err(error.into()),
                    }
                }
            });
        }
        Ok(looks)
    }

    /// Like `claim`, but when nothing is ready waits up to `wait` for work of the service to
    /// appear, woken by the database's notifications rather than by polling.
    pub async fn claim_waiting(
        &self,
        request: &ClaimRequest,
        wait: Duration,
    ) -> Result<Vec<WorkItem>, BrokerError> {
        self.asks.record(request.service.as_str());
        let items = self.wait_for_claim(request, wait).await?;
        let outcome = if items.is_empty() { ClaimOutcome::Empty } else { ClaimOutcome::Item };
        self.core.metrics.claim_answered(request.service.as_str(), outcome);
        Ok(items)
    }

    async fn wait_for_claim(
        &self,
        request: &ClaimRequest,
        wait: Duration,
    ) -> Result<Vec<WorkItem>, BrokerError> {
        let deadline = Instant::now() + wait.min(self.core.settings.long_poll_max);
        let signal = self.core.signals.for_service(request.service.as_str());
        loop {
            let mut notified = pin!(signal.notified());
            notified.as_mut().enable();
            let (items, limit) = self.claim_within_policy(request).await?;
            if !items.is_empty() || Instant::now() >= deadline {
                return Ok(items);
            }
            let _waiting = signal.waiting();
            // A waiting querier is still there: its last_seen keeps moving while it waits, so
            // that it neither looks disconnected nor is forgotten in the middle of a long poll.
            let touch_every = Duration::from_millis(self.core.touch_every_millis().unsigned_abs());
            // Held back by a cap, a slot frees with an ending that may be another broker's,
            // which nothing signals here: look again on a short period. Held back by a rate,
            // look again when the next item is due.
            let capped =
                limit == Some(Limit::Cap) || request.strategy.as_deref().is_some_and(has_hard_cap);
            let slice = match limit {
                Some(Limit::Rate(due)) => due.min(touch_every),
                _ if capped => CAPPED_POLL,
                _ => touch_every,
            };
            // A slot that frees or a bucket that refills is not notified: after each slice, look
            // again.
            let look_again = capped || limit.is_some();
            loop {
                let until = deadline.min(Instant::now() + slice);
                tokio::select! {
                    woken = tokio::time::timeout_at(until, notified.as_mut()) => {
                        if woken.is_ok() {
                            break;
                        }
                    }
                    () = self.core.drained() => return Ok(items),
                }
                if look_again && Instant::now() < deadline {
                    break;
                }
                self.tenancy.touch(request.querier.as_str()).await?;
                if Instant::now() >= deadline {
                    return Ok(items);
                }
            }
        }
    }
}

/// The services a batch's requests ask for, each once, as a span attribute.
fn services_of(requests: &[ClaimRequest]) -> String {
    let services: BTreeSet<&str> =
        requests.iter().map(|request| request.service.as_str()).collect();
    services.into_iter().collect::<Vec<_>>().join(",")
}
