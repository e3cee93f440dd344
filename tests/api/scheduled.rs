//! Retry policies with backoff, and scheduled items: a retry under a delay, or a job submitted
//! with not_before, waits as `scheduled`, invisible to claims, until the promoter makes it
//! ready.

use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use fairway_server::config::ServeArgs;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app_with, spawn_broker, TestApp};
use crate::metrics::scrape_until;

/// A broker whose promoter looks every 50 ms, so that tests wait little past an item's time.
fn args() -> ServeArgs {
    let mut args = ServeArgs::for_tests();
    args.retry.promote_interval = Duration::from_millis(50);
    args
}

/// A one-step job of `items` items on `service` for `user`, with `extra` fields merged in.
fn job_body(user: &str, service: &str, items: usize, extra: Value) -> Value {
    let items: Vec<Value> = (0..items).map(|n| json!({ "payload": { "n": n } })).collect();
    let mut body = json!({ "user": user, "steps": [{ "service": service }], "items": items });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

/// The job's items, as GET /jobs/{id}/items lists them.
async fn items(app: &TestApp, job: Uuid) -> Vec<Value> {
    let response = app.get(&format!("/jobs/{job}/items")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("JSON");
    body["items"].as_array().cloned().expect("items")
}

fn time(value: &Value) -> DateTime<Utc> {
    value.as_str().and_then(|text| text.parse().ok()).unwrap_or_else(|| panic!("a time: {value}"))
}

/// Reports a retryable failure of `item` and returns the item's status after it.
async fn fail(app: &TestApp, item: &Value) -> String {
    let failure = json!({ "status": "failed", "attempt": item["attempt"], "error": "flaky" });
    let response = app.report(item, failure).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("JSON");
    body["status"].as_str().expect("status").to_owned()
}

/// Claims `service` in a loop until an item comes, asserting that none comes before
/// `not_before`; gives up after `within`. Returns the item.
async fn claim_when_due(
    app: &TestApp,
    service: &str,
    not_before: DateTime<Utc>,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(item) = app.claim(service).await {
            let now = Utc::now();
            assert!(now >= not_before, "claimed at {now}, before its time {not_before}");
            return item;
        }
        assert!(Instant::now() < deadline, "the item never became claimable");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `check` holds for the job's items.
async fn await_items(app: &TestApp, job: Uuid, what: &str, check: impl Fn(&[Value]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if check(&items(app, job).await) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never happened: {:#?}", items(app, job).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The delay a scheduled item was given: its not_before less the moment it was scheduled.
fn delay(item: &Value) -> chrono::Duration {
    time(&item["not_before"]) - time(&item["updated_at"])
}

#[tokio::test]
async fn an_exponential_policy_schedules_growing_delays_until_its_attempts_run_out() {
    let app = spawn_app_with(args()).await;
    let retry =
        json!({ "max_attempts": 3, "backoff": "exponential", "initial": "1s", "max": "10s" });
    let job = app.submit(job_body("alice", "svc", 1, json!({ "retry": retry }))).await;
    let document = app.job(job).await;
    assert_eq!(
        document["retry"],
        json!({ "max_attempts": 3, "backoff": "exponential", "initial": "1s", "max": "10s" })
    );

    let mut item = app.claim("svc").await.expect("the item");
    let mut delays = Vec::new();
    for attempt in 1..=2 {
        assert_eq!(item["attempt"], attempt);
        assert_eq!(fail(&app, &item).await, "scheduled");
        assert!(app.claim("svc").await.is_none(), "a scheduled item is not claimable");
        let listed = items(&app, job).await.pop().expect("the item");
        assert_eq!(listed["status"], "scheduled");
        assert_eq!(listed["error"], "flaky");
        let scheduled = app.job(job).await;
        assert_eq!(scheduled["status"], "running");
        assert_eq!(scheduled["steps"][0]["scheduled"], 1);
        assert_eq!(scheduled["steps"][0]["ready"], 0);
        app.assert_consistent().await;
        delays.push(delay(&listed));
        item =
            claim_when_due(&app, "svc", time(&listed["not_before"]), Duration::from_secs(10)).await;
    }
    // Equal jitter: 0.5–1 s after the first failure, 1–2 s after the second.
    let millis: Vec<i64> = delays.iter().map(chrono::Duration::num_milliseconds).collect();
    assert!((500..=1000).contains(&millis[0]), "{millis:?}");
    assert!((1000..=2000).contains(&millis[1]), "{millis:?}");
    assert!(millis[1] >= millis[0], "{millis:?}");

    assert_eq!(item["attempt"], 3);
    assert_eq!(fail(&app, &item).await, "failed", "the third attempt was the last");
    let failed = app.job(job).await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["steps"][0]["scheduled"], 0);
    let listed = items(&app, job).await.pop().expect("the item");
    assert_eq!(listed["not_before"], Value::Null);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_policy_without_delay_retries_at_once_and_a_job_without_one_keeps_max_retries() {
    let mut args = args();
    args.max_retries = 1;
    let app = spawn_app_with(args).await;
    let none = json!({ "retry": { "max_attempts": 3, "backoff": "none" } });
    app.submit(job_body("alice", "at-once", 1, none)).await;
    for attempt in 1..=3 {
        let item = app.claim("at-once").await.expect("ready at once");
        assert_eq!(item["attempt"], attempt);
        let expected = if attempt < 3 { "ready" } else { "failed" };
        assert_eq!(fail(&app, &item).await, expected);
    }

    let plain = app.submit(job_body("bob", "plain", 1, json!({}))).await;
    assert_eq!(app.job(plain).await.get("retry"), None);
    let item = app.claim("plain").await.expect("the item");
    assert_eq!(fail(&app, &item).await, "ready", "--max-retries 1 allows one retry, at once");
    let item = app.claim("plain").await.expect("the item again");
    assert_eq!(fail(&app, &item).await, "failed");
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_expired_lease_under_a_delay_policy_goes_scheduled() {
    let mut args = args();
    args.lease = Duration::from_secs(1);
    args.reap_interval = Duration::from_millis(100);
    let app = spawn_app_with(args).await;
    let retry = json!({ "max_attempts": 2, "backoff": "fixed", "initial": "2s" });
    let job = app.submit(job_body("alice", "svc", 1, json!({ "retry": retry }))).await;
    let item = app.claim("svc").await.expect("the item");

    await_items(&app, job, "the lease's expiry", |items| items[0]["status"] == "scheduled").await;
    assert!(app.claim("svc").await.is_none(), "a scheduled item is not claimable");
    let listed = items(&app, job).await.pop().expect("the item");
    assert_eq!(listed["error"], "lease expired");
    assert_eq!(delay(&listed).num_milliseconds(), 2000, "fixed: no jitter");
    app.assert_consistent().await;

    let again =
        claim_when_due(&app, "svc", time(&listed["not_before"]), Duration::from_secs(10)).await;
    assert_eq!(again["id"], item["id"]);
    assert_eq!(again["attempt"], 2);
}

#[tokio::test]
async fn items_submitted_with_not_before_wait_for_it() {
    let app = spawn_app_with(args()).await;
    // Whole milliseconds: the database keeps microseconds.
    let not_before = (Utc::now() + chrono::Duration::milliseconds(1500)).trunc_subsecs(3);
    let job = app
        .submit(job_body("alice", "svc", 3, json!({ "not_before": not_before.to_rfc3339() })))
        .await;
    let document = app.job(job).await;
    assert_eq!(time(&document["not_before"]), not_before);
    assert_eq!(document["steps"][0]["scheduled"], 3);
    assert_eq!(document["steps"][0]["ready"], 0);
    assert!(app.claim("svc").await.is_none(), "scheduled items are not claimable");
    for item in items(&app, job).await {
        assert_eq!(item["status"], "scheduled");
        assert_eq!(time(&item["not_before"]), not_before);
    }
    app.assert_consistent().await;

    claim_when_due(&app, "svc", not_before, Duration::from_secs(10)).await;
    let promoted = app.job(job).await;
    assert_eq!(promoted["steps"][0]["scheduled"], 0);
    assert_eq!(promoted["steps"][0]["ready"], 2);
    assert_eq!(promoted["steps"][0]["running"], 1);
    app.assert_consistent().await;

    // A time already past: ready at once.
    let past = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let job = app.submit(job_body("bob", "past", 1, json!({ "not_before": past }))).await;
    assert_eq!(app.job(job).await["steps"][0]["ready"], 1);
    assert!(app.claim("past").await.is_some());
}

#[tokio::test]
async fn two_brokers_promote_each_item_once() {
    // Their own promoters only look once an hour (and at start, when nothing is due): the
    // test runs the passes itself, at the same time in both brokers.
    let mut args = ServeArgs::for_tests();
    args.retry.promote_interval = Duration::from_secs(3600);
    let first = spawn_app_with(args.clone()).await;
    let second = spawn_broker(args, first.config.clone()).await;
    let count = 1200;
    let not_before = Utc::now() + chrono::Duration::milliseconds(500);
    let mut jobs = Vec::new();
    for user in ["alice", "bob", "carol"] {
        let body =
            job_body(user, "svc", count / 3, json!({ "not_before": not_before.to_rfc3339() }));
        jobs.push(first.submit(body).await);
    }

    // Passes before the items are due promote nothing; then both brokers' passes together
    // promote each item once.
    let mut promoted = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while promoted < count {
        let (one, other) = tokio::join!(
            first.broker.maintenance().promote_scheduled_items(),
            second.broker.maintenance().promote_scheduled_items(),
        );
        promoted += one.expect("first broker's pass") + other.expect("second broker's pass");
        assert!(Instant::now() < deadline, "only {promoted} of {count} promoted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(promoted, count, "each item promoted once");
    for job in jobs {
        let steps = &first.job(job).await["steps"][0];
        assert_eq!((steps["ready"].as_i64(), steps["scheduled"].as_i64()), (Some(400), Some(0)));
    }
    first.assert_consistent().await;
    let claimed = first.claim_with("service=svc&querier=pod-0&max=10").await;
    assert_eq!(claimed.len(), 10);
}

#[tokio::test]
async fn a_paused_jobs_due_items_stay_unclaimable_and_cancel_cancels_scheduled_items() {
    let app = spawn_app_with(args()).await;
    let soon = (Utc::now() + chrono::Duration::milliseconds(300)).to_rfc3339();
    let paused = app.submit(job_body("alice", "svc", 2, json!({ "not_before": soon }))).await;
    let response = app.post(&format!("/jobs/{paused}/pause"), &Value::Null).await;
    assert_eq!(response.status(), StatusCode::OK);
    await_items(&app, paused, "promotion", |items| items.iter().all(|i| i["status"] == "ready"))
        .await;
    assert!(app.claim("svc").await.is_none(), "a paused job's promoted items are not claimable");
    app.assert_consistent().await;
    let response = app.post(&format!("/jobs/{paused}/resume"), &Value::Null).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(app.claim("svc").await.is_some(), "resumed, its items are claimable");

    let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let doomed = app.submit(job_body("bob", "other", 3, json!({ "not_before": later }))).await;
    let response = app.post(&format!("/jobs/{doomed}/cancel"), &Value::Null).await;
    assert_eq!(response.status(), StatusCode::OK);
    let canceled: Value = response.json().await.expect("JSON");
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["steps"][0]["canceled"], 3);
    assert_eq!(canceled["steps"][0]["scheduled"], 0);
    for item in items(&app, doomed).await {
        assert_eq!(item["status"], "canceled");
        assert_eq!(item["not_before"], Value::Null);
    }
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_job_with_scheduled_items_is_unfinished() {
    let app = spawn_app_with(args()).await;
    let retry = json!({ "max_attempts": 2, "backoff": "fixed", "initial": "1h" });
    let job = app.submit(job_body("alice", "svc", 2, json!({ "retry": retry }))).await;
    let first = app.claim("svc").await.expect("an item");
    app.succeed(&first, json!([])).await;
    let second = app.claim("svc").await.expect("the other item");
    assert_eq!(fail(&app, &second).await, "scheduled");

    let document = app.job(job).await;
    assert_eq!(document["status"], "running", "a scheduled item is still to run");
    assert!(document["progress"].as_u64().expect("progress") < 100);
    let response = app.post(&format!("/jobs/{job}/retry"), &Value::Null).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "nothing_to_retry", "a scheduled item has not failed");
    app.assert_consistent().await;
}

#[tokio::test]
async fn scheduled_items_show_in_the_metrics_and_the_services_overview() {
    let mut args = args();
    args.metrics.metrics_refresh = Duration::ZERO;
    let app = spawn_app_with(args).await;
    let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    app.submit(job_body("alice", "metered", 4, json!({ "not_before": later }))).await;
    let labels = [("service", "metered"), ("state", "scheduled")];
    let scraped = scrape_until(&app, "scheduled items", |scraped| {
        scraped.value("fairway_work_items", &labels) == Some(4.0)
    })
    .await;
    let ready = scraped.value("fairway_work_items", &[("service", "metered"), ("state", "ready")]);
    assert_eq!(ready, Some(0.0));
    let overview: Value = app.get("/admin/services").await.json().await.expect("JSON");
    let metered = &overview["services"][0];
    assert_eq!(metered["service"], "metered", "{overview}");
    assert_eq!((&metered["ready"], &metered["scheduled"]), (&json!(0), &json!(4)), "{overview}");
}

#[tokio::test]
async fn bad_policies_and_times_are_refused_naming_the_field() {
    let app = spawn_app_with(args()).await;
    let cases = [
        (json!({ "retry": { "max_attempts": 0 } }), "invalid_retry", "retry.max_attempts"),
        (json!({ "retry": { "max_attempts": 101 } }), "invalid_retry", "retry.max_attempts"),
        (json!({ "retry": { "backoff": "linear" } }), "invalid_retry", "retry.backoff"),
        (json!({ "retry": { "initial": "soon" } }), "invalid_retry", "retry.initial"),
        (json!({ "retry": { "max": "8days" } }), "invalid_retry", "retry.max"),
        (json!({ "retry": { "initial": "1h", "max": "1m" } }), "invalid_retry", "retry.initial"),
        (json!({ "retry": { "attempts": 3 } }), "invalid_retry", "retry.attempts"),
        (json!({ "retry": 3 }), "invalid_retry", "retry"),
        (json!({ "not_before": "tomorrow" }), "invalid_not_before", "not_before"),
        (json!({ "not_before": "2030-01-01 00:00" }), "invalid_not_before", "not_before"),
        (json!({ "not_before": 1_900_000_000 }), "invalid_not_before", "not_before"),
    ];
    let before = app.fingerprint().await;
    for (extra, code, field) in cases {
        let response = app.post("/jobs", &job_body("alice", "svc", 1, extra.clone())).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{extra}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], code, "{extra}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}:")), "{extra}: {message}");
    }
    assert_eq!(app.fingerprint().await, before, "a refused submission stores nothing");
}

#[tokio::test]
async fn the_openapi_document_describes_retry_and_not_before() {
    let app = spawn_app_with(args()).await;
    let document: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let schemas = &document["components"]["schemas"];
    let submitted = &schemas["JobBody"]["properties"];
    assert_eq!(submitted["not_before"]["format"], "date-time");
    assert!(submitted["retry"].to_string().contains("#/components/schemas/RetryDocument"));
    let policy = &schemas["RetryDocument"]["properties"];
    for field in ["max_attempts", "backoff", "initial", "max"] {
        assert!(policy.get(field).is_some(), "RetryDocument lacks {field}: {policy}");
    }
    assert_eq!(schemas["Backoff"]["enum"], json!(["none", "fixed", "exponential"]));
    assert!(schemas["StepDocument"]["properties"].get("scheduled").is_some());
    assert!(schemas["ItemDocument"]["properties"].get("not_before").is_some());
    assert!(schemas["ItemStatus"].to_string().contains("scheduled"));
}
