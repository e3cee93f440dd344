//! Re-running failed work: POST /jobs/{id}/retry, and `fairway admin jobs retry`.

use fairway_server::config::ServeArgs;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, spawn_app_with, spawn_app_with_auth, TestApp};

async fn retry(app: &TestApp, job: Uuid) -> reqwest::Response {
    app.post(&format!("/jobs/{job}/retry"), &Value::Null).await
}

/// Fails `item` for good.
async fn fail_for_good(app: &TestApp, item: &Value) {
    let failure = json!({ "status": "failed", "attempt": item["attempt"], "error": "gone", "retryable": false });
    let response = app.report(item, failure).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["status"], "failed");
}

/// Asserts a 409 with `code`, and that it changed nothing.
async fn assert_refused(app: &TestApp, job: Uuid, status: StatusCode, code: &str) {
    let before = app.fingerprint().await;
    let response = retry(app, job).await;
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(app.fingerprint().await, before, "a refused retry changes nothing");
}

#[tokio::test]
async fn a_retry_reruns_the_failed_items_with_a_fresh_budget_until_the_job_succeeds() {
    let args = ServeArgs { max_retries: 1, ..ServeArgs::for_tests() };
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "svc", 2, true).await;
    let first = app.claim("svc").await.expect("an item");
    app.succeed(&first, json!([])).await;
    let second = app.claim("svc").await.expect("the other item");
    fail_for_good(&app, &second).await;
    assert_eq!(app.job(job).await["status"], "complete_with_errors");

    let response = retry(&app, job).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["retried"], 1);
    assert_eq!(body["job_id"], job.to_string());
    assert_eq!(body["status"], "running");
    assert_eq!(body["steps"][0]["ready"], 1);
    assert_eq!(body["steps"][0]["failed"], 0);
    app.assert_consistent().await;

    // The next attempt, and a fresh budget: attempt 2 is past --max-retries 1 counted from
    // the first attempt, yet its retryable failure is retried.
    let again = app.claim("svc").await.expect("the retried item");
    assert_eq!(again["id"], second["id"]);
    assert_eq!(again["attempt"], 2);
    let flaky = json!({ "status": "failed", "attempt": 2, "error": "flaky" });
    let answer: Value = app.report(&again, flaky).await.json().await.expect("JSON");
    assert_eq!(answer["status"], "ready", "the fresh budget allows one retry");
    let last = app.claim("svc").await.expect("the item, retried");
    assert_eq!(last["attempt"], 3);
    app.succeed(&last, json!([])).await;
    let done = app.job(job).await;
    assert_eq!(done["status"], "successful");
    assert_eq!(done["steps"][0]["successful"], 2);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_retried_budget_runs_out_like_the_first() {
    let args = ServeArgs { max_retries: 1, ..ServeArgs::for_tests() };
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    fail_for_good(&app, &item).await;
    assert_eq!(retry(&app, job).await.status(), StatusCode::OK);
    for (attempt, expected) in [(2, "ready"), (3, "failed")] {
        let item = app.claim("svc").await.expect("the item");
        assert_eq!(item["attempt"], attempt);
        let flaky = json!({ "status": "failed", "attempt": attempt, "error": "flaky" });
        let answer: Value = app.report(&item, flaky).await.json().await.expect("JSON");
        assert_eq!(answer["status"], expected, "after attempt {attempt}");
    }
    assert_eq!(app.job(job).await["status"], "failed");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_job_with_nothing_failed_has_nothing_to_retry() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    assert_refused(&app, job, StatusCode::CONFLICT, "nothing_to_retry").await;
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!([])).await;
    assert_refused(&app, job, StatusCode::CONFLICT, "nothing_to_retry").await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_canceled_job_is_not_retried() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 2, true).await;
    let item = app.claim("svc").await.expect("item");
    fail_for_good(&app, &item).await;
    let canceled = app.post(&format!("/jobs/{job}/cancel"), &Value::Null).await;
    assert_eq!(canceled.status(), StatusCode::OK);
    assert_refused(&app, job, StatusCode::CONFLICT, "job_canceled").await;
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_unknown_job_is_not_found() {
    let app = spawn_app().await;
    assert_refused(&app, Uuid::new_v4(), StatusCode::NOT_FOUND, "job_not_found").await;
}

/// Alice's job of two items on service `a`, whose results service `b` aggregates.
async fn submit_two_items_then_an_aggregate(app: &TestApp) -> Uuid {
    app.submit(json!({
        "user": "alice",
        "steps": [{ "service": "a" }, { "service": "b", "aggregate": true }],
        "items": [{ "payload": 1 }, { "payload": 2 }],
    }))
    .await
}

/// An aggregating step that already ran over the items that succeeded cannot take the
/// retried items' results: the retry is refused rather than leave them out silently.
#[tokio::test]
async fn a_retry_is_refused_once_an_aggregate_ran_over_partial_inputs() {
    let app = spawn_app().await;
    let job = submit_two_items_then_an_aggregate(&app).await;
    let first = app.claim("a").await.expect("item");
    app.succeed(&first, json!(["r1"])).await;
    let second = app.claim("a").await.expect("item");
    fail_for_good(&app, &second).await;
    let aggregate = app.claim("b").await.expect("the aggregate, over the partial inputs");
    app.succeed(&aggregate, json!(["merged"])).await;
    assert_eq!(app.job(job).await["status"], "complete_with_errors");
    assert_refused(&app, job, StatusCode::CONFLICT, "aggregation_started").await;
    app.assert_consistent().await;
}

/// Before the aggregate's item exists (its inputs are not final), the retry is taken.
#[tokio::test]
async fn a_retry_before_the_aggregate_ran_feeds_it() {
    let app = spawn_app().await;
    let job = submit_two_items_then_an_aggregate(&app).await;
    let first = app.claim("a").await.expect("item");
    fail_for_good(&app, &first).await;
    let second = app.claim("a").await.expect("item");
    app.post(&format!("/jobs/{job}/pause"), &Value::Null).await;
    let response = retry(&app, job).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["status"], "paused", "a paused job stays paused");
    app.post(&format!("/jobs/{job}/resume"), &Value::Null).await;
    app.succeed(&second, json!(["r2"])).await;
    let again = app.claim("a").await.expect("the retried item");
    app.succeed(&again, json!(["r1"])).await;
    let aggregate = app.claim("b").await.expect("the aggregate");
    let mut inputs: Vec<String> =
        serde_json::from_value(aggregate["inputs"].clone()).expect("inputs");
    inputs.sort();
    assert_eq!(inputs, ["r1", "r2"]);
    app.succeed(&aggregate, json!(["merged"])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

async fn bulk(app: &TestApp, action: &str, filter: Value) -> Value {
    let response = app.post(&format!("/admin/jobs/{action}"), &filter).await;
    assert_eq!(response.status(), StatusCode::OK, "{action} {filter}");
    response.json().await.expect("JSON")
}

fn counts(matched: u64, changed: u64) -> Value {
    json!({ "matched": matched, "changed": changed })
}

#[tokio::test]
async fn a_bulk_action_applies_to_the_jobs_its_filter_matches() {
    let app = spawn_app().await;
    let failing = app.submit_simple("alice", "svc-a", 1, true).await;
    let waiting = app.submit_simple("alice", "svc-c", 1, true).await;
    let other = app.submit_simple("bob", "svc-b", 1, true).await;
    let item = app.claim("svc-a").await.expect("item");
    fail_for_good(&app, &item).await;
    assert_eq!(app.job(failing).await["status"], "failed");

    assert_eq!(bulk(&app, "pause", json!({ "user": "alice" })).await, counts(2, 1));
    assert_eq!(app.job(waiting).await["status"], "paused");
    assert_eq!(app.job(other).await["status"], "accepted");
    assert_eq!(bulk(&app, "pause", json!({ "user": "alice" })).await, counts(2, 0));
    assert_eq!(bulk(&app, "resume", json!({ "user": "alice" })).await, counts(2, 1));
    assert_eq!(app.job(waiting).await["status"], "accepted");

    assert_eq!(bulk(&app, "retry", json!({ "user": "alice" })).await, counts(2, 1));
    assert_eq!(app.job(failing).await["status"], "running");
    app.assert_consistent().await;

    let filter = json!({ "user": "alice", "status": "running" });
    assert_eq!(bulk(&app, "cancel", filter).await, counts(1, 1));
    assert_eq!(app.job(failing).await["status"], "canceled");
    assert_eq!(app.job(waiting).await["status"], "accepted");
    assert_eq!(bulk(&app, "cancel", json!({ "service": "svc-b" })).await, counts(1, 1));
    assert_eq!(app.job(other).await["status"], "canceled");
    let old = json!({ "submitted_before": "2000-01-01T00:00:00Z" });
    assert_eq!(bulk(&app, "cancel", old).await, counts(0, 0));
    assert_eq!(app.job(waiting).await["status"], "accepted");
    app.assert_consistent().await;
}

/// What a confirmation shows before a bulk action: how many jobs it would match, for every
/// action, with nothing changed.
#[tokio::test]
async fn a_dry_run_counts_the_jobs_a_bulk_action_would_match_and_changes_nothing() {
    let app = spawn_app().await;
    for _ in 0..3 {
        app.submit_simple("alice", "svc", 1, true).await;
    }
    let bobs = app.submit_simple("bob", "svc", 1, true).await;
    let before = app.fingerprint().await;
    for action in ["pause", "resume", "cancel", "retry"] {
        let counted = bulk(&app, action, json!({ "user": "alice", "dry_run": true })).await;
        assert_eq!(counted, counts(3, 0), "{action}");
    }
    let response = app.post("/admin/jobs/cancel", &json!({ "dry_run": true })).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "a dry run needs a filter too");
    assert_eq!(app.fingerprint().await, before, "dry runs change nothing");

    assert_eq!(bulk(&app, "cancel", json!({ "user": "alice" })).await, counts(3, 3));
    assert_eq!(app.job(bobs).await["status"], "accepted");
}

/// More jobs than one page of the bulk action's reads: each is met once.
#[tokio::test]
async fn a_bulk_action_pages_through_every_matching_job() {
    let app = spawn_app().await;
    for _ in 0..205 {
        app.submit_simple("carol", "svc", 1, true).await;
    }
    assert_eq!(bulk(&app, "cancel", json!({ "user": "carol" })).await, counts(205, 205));
    let open: i64 = app
        .db
        .query_one("SELECT count(*) FROM jobs WHERE status <> 'canceled'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(open, 0);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_bulk_action_needs_a_filter_and_refuses_a_bad_one() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    let before = app.fingerprint().await;
    for (action, body, code) in [
        ("cancel", json!({}), "empty_filter"),
        ("cancel", json!({ "user": null }), "empty_filter"),
        ("cancel", json!({ "users": "alice" }), ""),
        ("cancel", json!({ "status": "sleeping" }), ""),
        ("cancel", json!({ "submitted_before": "yesterday" }), ""),
        ("explode", json!({ "user": "alice" }), ""),
    ] {
        let response = app.post(&format!("/admin/jobs/{action}"), &body).await;
        assert!(response.status().is_client_error(), "{action} {body}: {}", response.status());
        let error: Value = response.json().await.expect("a JSON error");
        assert!(error["error"]["code"].is_string(), "{error}");
        if !code.is_empty() {
            assert_eq!(error["error"]["code"], code);
            assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("user")));
        }
    }
    assert_eq!(app.fingerprint().await, before, "refused bulk actions change nothing");
}

#[tokio::test]
async fn a_producer_tokens_bulk_action_reaches_only_its_tenants_jobs() {
    let app = spawn_app_with_auth().await;
    let made: Value = app
        .post("/admin/tokens", &json!({ "role": "producer", "tenants": ["acme"] }))
        .await
        .json()
        .await
        .expect("JSON");
    let producer = made["token"].as_str().expect("token").to_owned();
    let job = |tenant: &str| {
        json!({ "user": "dave", "tenant": tenant, "steps": [{ "service": "svc" }],
                "items": [{ "payload": 1 }] })
    };
    let acme = app.submit(job("acme")).await;
    let globex = app.submit(job("globex")).await;
    let send = |token: String, body: Value| {
        app.http.post(app.url("/admin/jobs/pause")).bearer_auth(token).json(&body).send()
    };

    let response = send(producer.clone(), json!({ "user": "dave" })).await.expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.expect("JSON"), counts(1, 1));
    assert_eq!(app.job(acme).await["status"], "paused");
    assert_eq!(app.job(globex).await["status"], "accepted", "another tenant's job");

    let before = app.fingerprint().await;
    let response = send(producer, json!({ "tenant": "globex" })).await.expect("send");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let made: Value =
        app.post("/admin/tokens", &json!({ "role": "reader" })).await.json().await.expect("JSON");
    let reader = made["token"].as_str().expect("token").to_owned();
    let response = send(reader, json!({ "user": "dave" })).await.expect("send");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.fingerprint().await, before, "refused bulk actions change nothing");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_retry_that_would_take_the_tenant_past_its_limit_is_refused() {
    let app = spawn_app().await;
    let tenant = json!({ "max_queriers": 0, "max_outstanding": 2 });
    let set = app.request(reqwest::Method::PUT, "/admin/tenants/acme").json(&tenant).send();
    assert_eq!(set.await.expect("set the tenant").status(), StatusCode::OK);
    let job = app
        .submit(json!({ "user": "alice", "tenant": "acme", "steps": [{ "service": "svc" }],
                        "items": [{ "payload": 1 }, { "payload": 2 }] }))
        .await;
    for _ in 0..2 {
        let item = app.claim("svc").await.expect("an item");
        fail_for_good(&app, &item).await;
    }
    // Two more ready items fill the tenant's limit: the two failed ones cannot come back.
    app.submit(json!({ "user": "bob", "tenant": "acme", "steps": [{ "service": "svc" }],
                       "items": [{ "payload": 3 }, { "payload": 4 }] }))
        .await;
    assert_refused(&app, job, StatusCode::TOO_MANY_REQUESTS, "too_many_outstanding").await;
}
