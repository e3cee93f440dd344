//! The outcome rules of an ending, apart from the database: what a worker's report, an expired
//! lease or a release records on its item, when a failure is retried and after how long, what
//! makes two reports the same one, and why an update that did not apply is refused.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::statements::ItemState;
use crate::error::BrokerError;
use fairway_api::model::{ComponentName, ItemStatus, WorkItemId};
use fairway_api::retry::RetryPolicy;

/// How an attempt ended, as recorded on the item.
#[derive(Clone)]
pub(super) enum Ending {
    /// A worker's report.
    Successful { results: Vec<Value>, component: Option<ComponentName>, warning: Option<String> },
    /// A worker's report.
    Failed { error: Option<String>, retryable: bool },
    /// The lease ran out without a report (the reaper): a retryable failure.
    Expired,
    /// A claim whose answer reached no worker (its long poll was gone): the item goes back to
    /// ready as if never claimed, the attempt not counted.
    Released,
    /// A worker that could not start the item hands it back: ready again at once, the attempt
    /// kept (a late report of it is stale) but not counted against the retry budget.
    HandedBack { reason: Option<String> },
}

/// What an ending records on its item.
pub(super) struct Recorded<'a> {
    pub(super) status: ItemStatus,
    pub(super) results: Option<&'a Vec<Value>>,
    pub(super) error: Option<&'a str>,
    pub(super) next_component: Option<&'a str>,
    /// The worker's report's digest (`AttemptEnding::digest`); none for the broker's own.
    pub(super) digest: Option<Vec<u8>>,
    /// Takes the claim's attempt back (a release).
    pub(super) uncounted: bool,
    /// A worker handing the item back; `error` holds its reason.
    pub(super) handed_back: bool,
    /// A successful ending's warning.
    pub(super) warning: Option<&'a str>,
    /// A scheduled retry's delay in milliseconds.
    pub(super) delay_millis: Option<i64>,
}

/// What decides an item's next retry: the attempt its budget counts from, and its job's policy
/// (None: the broker's --max-retries, retried at once).
pub(super) struct RetryBudget {
    pub(super) base: i32,
    pub(super) policy: Option<RetryPolicy>,
}

/// A worker's report that ends its attempt, as the ending batches carry it.
#[derive(Clone)]
pub(crate) struct AttemptEnding {
    pub(super) id: WorkItemId,
    pub(super) attempt: i32,
    pub(super) ending: Ending,
    /// The reporting token, which must be the one that claimed the attempt; None: any.
    pub(super) token: Option<i64>,
}

impl AttemptEnding {
    /// What makes two reports "the same update": SHA-256 over the reporting token (with auth, a
    /// repeat must come with the token that sent the first), the attempt and the report as
    /// the worker sent it (status, results and component; or error and retryable), in
    /// serde_json's canonical form (object keys sorted, so key order and whitespace do not
    /// matter). None for an ending no worker reported.
    pub(super) fn digest(&self) -> Option<Vec<u8>> {
        let report = match &self.ending {
            Ending::Successful { results, component, warning } => {
                let mut report = serde_json::json!({
                    "token": self.token,
                    "attempt": self.attempt,
                    "status": "successful",
                    "results": results,
                    "component": component.as_ref().map(ComponentName::as_str),
                });
                // Only when given, so that a report without one digests as it always did.
                if let Some(warning) = warning {
                    report["warning"] = Value::String(warning.clone());
                }
                report
            }
            Ending::Failed { error, retryable } => serde_json::json!({
                "token": self.token,
                "attempt": self.attempt,
                "status": "failed",
                "error": error,
                "retryable": retryable,
            }),
            Ending::HandedBack { reason } => serde_json::json!({
                "token": self.token,
                "attempt": self.attempt,
                "status": "released",
                "reason": reason,
            }),
            Ending::Expired | Ending::Released => return None,
        };
        Some(Sha256::digest(report.to_string().as_bytes()).to_vec())
    }
}

/// What an ending records on its item: a retryable failure (or an expired lease) is a
/// retry while the item's budget lasts, counted from the attempt it starts at; ready at
/// once, or scheduled after its policy's delay. `max_retries` is the budget without a policy;
/// `unit`, uniform in [0, 1), draws the delay's jitter.
pub(super) fn record<'a>(
    ending: &'a AttemptEnding,
    budget: Option<&RetryBudget>,
    max_retries: u32,
    unit: f64,
) -> Recorded<'a> {
    let (base, policy) = budget.map_or((0, None), |budget| (budget.base, budget.policy));
    let used = i64::from(ending.attempt) - i64::from(base);
    let failed = |error: Option<&'a str>, retryable: bool, digest: Option<Vec<u8>>| {
        let (status, delay_millis) = match retryable {
            true => retry(used, policy.as_ref(), max_retries, unit),
            false => (ItemStatus::Failed, None),
        };
        Recorded {
            status,
            results: None,
            error,
            next_component: None,
            digest,
            uncounted: false,
            handed_back: false,
            warning: None,
            delay_millis,
        }
    };
    match &ending.ending {
        Ending::Successful { results, component, warning } => Recorded {
            status: ItemStatus::Successful,
            results: Some(results),
            error: None,
            warning: warning.as_deref(),
            next_component: component.as_ref().map(ComponentName::as_str),
            digest: ending.digest(),
            uncounted: false,
            handed_back: false,
            delay_millis: None,
        },
        Ending::Failed { error, retryable } => {
            failed(error.as_deref(), *retryable, ending.digest())
        }
        Ending::Expired => failed(Some("lease expired"), true, None),
        Ending::Released => Recorded {
            status: ItemStatus::Ready,
            results: None,
            error: None,
            next_component: None,
            digest: None,
            uncounted: true,
            handed_back: false,
            warning: None,
            delay_millis: None,
        },
        Ending::HandedBack { reason } => Recorded {
            status: ItemStatus::Ready,
            results: None,
            error: reason.as_deref(),
            next_component: None,
            digest: ending.digest(),
            uncounted: false,
            handed_back: true,
            warning: None,
            delay_millis: None,
        },
    }
}

/// Where a retryable failure of an item that has used `used` attempts of its budget goes:
/// ready, or scheduled with a delay in milliseconds, while the budget lasts; else failed.
fn retry(
    used: i64,
    policy: Option<&RetryPolicy>,
    max_retries: u32,
    unit: f64,
) -> (ItemStatus, Option<i64>) {
    let Some(policy) = policy else {
        let retry_allowed = used <= i64::from(max_retries);
        let status = if retry_allowed { ItemStatus::Ready } else { ItemStatus::Failed };
        return (status, None);
    };
    if !policy.allows_another(used) {
        return (ItemStatus::Failed, None);
    }
    let delay = policy.delay(u32::try_from(used).unwrap_or(u32::MAX), unit);
    match i64::try_from(delay.as_millis()).unwrap_or(i64::MAX) {
        0 => (ItemStatus::Ready, None),
        millis => (ItemStatus::Scheduled, Some(millis)),
    }
}

/// Why an update naming `attempt` of item `id` (`item`, as it stands) is refused.
pub(super) fn refusal(
    item: &ItemState,
    id: WorkItemId,
    attempt: i32,
    token: Option<i64>,
) -> BrokerError {
    let (status, current, claimed_by) = (&item.status, item.attempt, item.claimed_by);
    match status.as_str() {
        "running" if current == attempt && token.is_some() && claimed_by != token => {
            BrokerError::Forbidden {
                code: "not_your_item",
                message: format!(
                    "attempt {attempt} of work item {id} was claimed with another token; only \
                     that token may report on it"
                ),
            }
        }
        "successful" | "failed" | "canceled" => BrokerError::conflict(
            "item_finished",
            format!("work item {id} is already {status}"),
        ),
        "ready" if current == 0 => BrokerError::conflict(
            "stale_attempt",
            format!(
                "work item {id} was never claimed, so attempt {attempt} never held a lease: \
                 claim it with GET /work, then report the attempt the claim gave"
            ),
        ),
        _ if current != attempt => BrokerError::conflict(
            "stale_attempt",
            format!("attempt {attempt} of work item {id} is not current (the current attempt is {current})"),
        ),
        _ => BrokerError::conflict(
            "stale_attempt",
            format!("attempt {attempt} of work item {id} no longer holds a lease"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fairway_api::retry::Backoff;
    use serde_json::json;

    use super::*;

    const MAX_RETRIES: u32 = 2;

    fn report(attempt: i32, ending: Ending) -> AttemptEnding {
        AttemptEnding { id: WorkItemId(7), attempt, ending, token: None }
    }

    fn failure(retryable: bool) -> Ending {
        Ending::Failed { error: Some("boom".to_owned()), retryable }
    }

    fn success(results: Vec<Value>, warning: Option<&str>) -> Ending {
        Ending::Successful { results, component: None, warning: warning.map(str::to_owned) }
    }

    fn policy(backoff: Backoff, max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            backoff,
            initial: Duration::from_secs(2),
            max: Duration::from_secs(60),
        }
    }

    fn status_of(ending: &AttemptEnding, budget: Option<&RetryBudget>) -> ItemStatus {
        record(ending, budget, MAX_RETRIES, 0.5).status
    }

    #[test]
    fn a_success_records_its_results_warning_and_digest() {
        let ending = report(1, success(vec![json!({"n": 1})], Some("slow")));
        let recorded = record(&ending, None, MAX_RETRIES, 0.5);
        assert_eq!(recorded.status, ItemStatus::Successful);
        assert_eq!(recorded.results, Some(&vec![json!({"n": 1})]));
        assert_eq!(recorded.warning, Some("slow"));
        assert_eq!(recorded.digest, ending.digest());
        assert!(recorded.digest.is_some());
        assert!(!recorded.uncounted && !recorded.handed_back);
    }

    #[test]
    fn without_a_policy_a_retryable_failure_is_retried_max_retries_times() {
        let attempts: Vec<ItemStatus> =
            (1..=3).map(|attempt| status_of(&report(attempt, failure(true)), None)).collect();
        assert_eq!(attempts, [ItemStatus::Ready, ItemStatus::Ready, ItemStatus::Failed]);
    }

    #[test]
    fn a_failure_that_is_not_retryable_fails_the_item_at_once() {
        assert_eq!(status_of(&report(1, failure(false)), None), ItemStatus::Failed);
    }

    #[test]
    fn the_budget_counts_from_the_items_retry_base() {
        let budget = RetryBudget { base: 3, policy: None };
        assert_eq!(status_of(&report(5, failure(true)), Some(&budget)), ItemStatus::Ready);
        assert_eq!(status_of(&report(6, failure(true)), Some(&budget)), ItemStatus::Failed);
    }

    #[test]
    fn an_expired_lease_is_a_retryable_failure_no_worker_reported() {
        let (first, last) = (report(1, Ending::Expired), report(3, Ending::Expired));
        let recorded = record(&first, None, MAX_RETRIES, 0.5);
        assert_eq!(recorded.status, ItemStatus::Ready);
        assert_eq!(recorded.error, Some("lease expired"));
        assert_eq!(recorded.digest, None);
        assert_eq!(record(&last, None, MAX_RETRIES, 0.5).status, ItemStatus::Failed);
    }

    #[test]
    fn a_policy_with_a_delay_schedules_the_retry_with_its_jitter() {
        let budget = RetryBudget { base: 0, policy: Some(policy(Backoff::Exponential, 5)) };
        // The second failure: 4 s before jitter, so 2 s to 4 s; unit 0.5 lands at 3 s.
        let (second, fourth) = (report(2, failure(true)), report(4, failure(true)));
        let recorded = record(&second, Some(&budget), MAX_RETRIES, 0.5);
        assert_eq!((recorded.status, recorded.delay_millis), (ItemStatus::Scheduled, Some(3_000)));
        let fixed = RetryBudget { base: 0, policy: Some(policy(Backoff::Fixed, 5)) };
        let recorded = record(&fourth, Some(&fixed), MAX_RETRIES, 0.9);
        assert_eq!((recorded.status, recorded.delay_millis), (ItemStatus::Scheduled, Some(2_000)));
    }

    #[test]
    fn a_policy_without_a_delay_retries_at_once_until_its_attempts_are_spent() {
        let budget = RetryBudget { base: 0, policy: Some(policy(Backoff::None, 3)) };
        let statuses: Vec<(ItemStatus, Option<i64>)> = (1..=3)
            .map(|attempt| {
                let ending = report(attempt, failure(true));
                let recorded = record(&ending, Some(&budget), 9, 0.5);
                (recorded.status, recorded.delay_millis)
            })
            .collect();
        let ready = (ItemStatus::Ready, None);
        assert_eq!(statuses, [ready, ready, (ItemStatus::Failed, None)]);
    }

    #[test]
    fn a_release_is_uncounted_and_a_hand_back_keeps_its_reason() {
        let release = report(1, Ending::Released);
        let released = record(&release, None, 0, 0.5);
        assert_eq!(released.status, ItemStatus::Ready);
        assert!(released.uncounted && !released.handed_back);
        assert_eq!(released.digest, None);
        let reason = Some("no GPU".to_owned());
        let ending = report(1, Ending::HandedBack { reason });
        let handed_back = record(&ending, None, 0, 0.5);
        assert_eq!(handed_back.status, ItemStatus::Ready, "handing back spends no retry");
        assert!(handed_back.handed_back && !handed_back.uncounted);
        assert_eq!(handed_back.error, Some("no GPU"));
        assert!(handed_back.digest.is_some(), "a hand-back sent again is the same update");
    }

    #[test]
    fn the_same_report_digests_alike_whatever_its_key_order() {
        let first = report(2, success(vec![json!({"a": 1, "b": [1, 2]})], None));
        let again = report(2, success(vec![json!({"b": [1, 2], "a": 1})], None));
        assert_eq!(first.digest(), again.digest());
    }

    #[test]
    fn a_digest_changes_with_the_attempt_the_token_the_results_and_a_warning() {
        let base = report(2, success(vec![json!(1)], None));
        let others = [
            report(3, success(vec![json!(1)], None)),
            AttemptEnding { token: Some(4), ..report(2, success(vec![json!(1)], None)) },
            report(2, success(vec![json!(2)], None)),
            report(2, success(vec![json!(1)], Some("late"))),
            report(2, failure(true)),
        ];
        for other in &others {
            assert_ne!(base.digest(), other.digest());
        }
        assert_eq!(report(2, Ending::Expired).digest(), None);
        assert_eq!(report(2, Ending::Released).digest(), None);
    }

    fn item(status: &str, attempt: i32, claimed_by: Option<i64>) -> ItemState {
        ItemState {
            status: status.to_owned(),
            attempt,
            claimed_by,
            ended_as: None,
            ending_digest: None,
        }
    }

    fn code(error: BrokerError) -> &'static str {
        match error {
            BrokerError::Conflict { code, .. } | BrokerError::Forbidden { code, .. } => code,
            other => panic!("not a refusal: {other}"),
        }
    }

    #[test]
    fn a_refusal_says_why_the_update_did_not_apply() {
        let id = WorkItemId(7);
        let refused = |state: ItemState, attempt, token| code(refusal(&state, id, attempt, token));
        assert_eq!(refused(item("running", 2, Some(1)), 2, Some(9)), "not_your_item");
        assert_eq!(refused(item("successful", 2, Some(1)), 2, Some(1)), "item_finished");
        assert_eq!(refused(item("canceled", 1, None), 1, None), "item_finished");
        assert_eq!(refused(item("ready", 0, None), 1, None), "stale_attempt");
        assert_eq!(refused(item("running", 3, Some(1)), 2, Some(1)), "stale_attempt");
        assert_eq!(refused(item("ready", 2, None), 2, None), "stale_attempt");
        let never = refusal(&item("ready", 0, None), id, 1, None).to_string();
        assert!(never.contains("never claimed"), "{never}");
        let other = refusal(&item("running", 3, None), id, 2, None).to_string();
        assert!(other.contains("the current attempt is 3"), "{other}");
    }
}
