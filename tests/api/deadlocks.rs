//! Deadlocks inside the broker's transactions, forced for real (cargo feature
//! `fault-injection`, crates/fairway-broker/src/faults.rs): the broker's transaction and a second session take
//! two locks in opposite order, and PostgreSQL's deadlock detector aborts the broker's with
//! 40P01. A transient one is retried and the request succeeds; one that lasts is 503 with
//! Retry-After, and changes nothing.

use fairway_server::config::ServeArgs;
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with};
use crate::metrics::scrape;
use fairway_broker::faults::Point;

const RETRIES: &str = "fairway_transaction_retries_total";
const EXHAUSTED: &str = "fairway_transaction_retries_exhausted_total";

fn labels(operation: &'static str) -> [(&'static str, &'static str); 2] {
    [("operation", operation), ("sqlstate", "40P01")]
}

#[tokio::test]
async fn a_transient_deadlock_in_a_status_update_is_retried_and_counted() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.broker.faults().deadlock(Point::EndAttempts, 1);
    app.succeed(&item, json!([])).await;
    assert_eq!(app.broker.faults().armed(Point::EndAttempts), 0, "the deadlock struck");
    assert_eq!(app.job(job).await["status"], "successful");
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get(RETRIES, &labels("end_attempts")), 1.0);
    assert_eq!(scraped.value(EXHAUSTED, &labels("end_attempts")), None);
    let finished = [("service", "svc"), ("status", "successful")];
    assert_eq!(scraped.get("fairway_work_items_finished_total", &finished), 1.0, "once");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_deadlocked_batch_runs_again_whole_for_all_its_endings() {
    let mut args = ServeArgs::for_tests();
    args.batches.ending_lanes = 1;
    let app = spawn_app_with(args).await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "svc" }, { "service": "next" }],
            "items": (0..8).map(|n| json!({ "payload": n })).collect::<Vec<_>>(),
        }))
        .await;
    let items = app.claim_with("service=svc&querier=pod-0&max=8").await;
    assert_eq!(items.len(), 8);
    app.broker.faults().deadlock(Point::EndAttempts, 1);
    let reports = items.iter().map(|item| {
        app.report(item, json!({ "status": "successful", "attempt": 1, "results": [item["id"]] }))
    });
    for response in join_all(reports).await {
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(app.broker.faults().armed(Point::EndAttempts), 0);
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get(RETRIES, &labels("end_attempts")), 1.0);
    let finished = [("service", "svc"), ("status", "successful")];
    assert_eq!(scraped.get("fairway_work_items_finished_total", &finished), 8.0);
    // Each ending grew its workflow once: eight items of the next step, no more.
    let next = app.claim_with("service=next&querier=pod-0&max=100").await;
    assert_eq!(next.len(), 8);
    assert_eq!(app.job(job).await["status"], "running");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_transient_deadlock_in_a_submission_stores_the_job_once() {
    let app = spawn_app().await;
    app.broker.faults().deadlock(Point::SubmitJob, 1);
    app.submit_simple("alice", "svc", 3, true).await;
    assert_eq!(app.broker.faults().armed(Point::SubmitJob), 0, "the deadlock struck");
    let jobs: i64 = app.db.query_one("SELECT count(*) FROM jobs", &[]).await.expect("jobs").get(0);
    let items: i64 =
        app.db.query_one("SELECT count(*) FROM work_items", &[]).await.expect("items").get(0);
    assert_eq!((jobs, items), (1, 3));
    assert_eq!(scrape(&app).await.get(RETRIES, &labels("submit_job")), 1.0);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_deadlock_that_persists_is_503_with_retry_after_and_changes_nothing() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.await_idle_tenant_queues_retired().await;
    let before = app.fingerprint_apart_from_tenant_hints().await;
    app.broker.faults().deadlock(Point::EndAttempts, 3);
    let response = app.report(&item, json!({ "status": "successful", "attempt": 1 })).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "database_contention", "{body}");
    assert!(body["error"]["message"].as_str().expect("message").contains("40P01"), "{body}");
    assert_eq!(app.broker.faults().armed(Point::EndAttempts), 0, "three runs, three deadlocks");
    assert_eq!(app.fingerprint_apart_from_tenant_hints().await, before, "nothing changed");
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get(RETRIES, &labels("end_attempts")), 2.0);
    assert_eq!(scraped.get(EXHAUSTED, &labels("end_attempts")), 1.0);
    assert_eq!(
        scraped.value("fairway_work_items_finished_total", &[("status", "successful")]),
        None
    );
    app.assert_consistent().await;

    // The worker sends it again, as Retry-After says, and it goes through.
    app.succeed(&item, json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_submission_that_keeps_deadlocking_is_503_and_stores_nothing() {
    let app = spawn_app().await;
    let before = app.fingerprint().await;
    app.broker.faults().deadlock(Point::SubmitJob, 3);
    let body = json!({ "user": "alice", "steps": [{ "service": "svc" }], "items": [{}] });
    let response = app.post("/jobs", &body).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(app.fingerprint().await, before, "nothing stored");
    assert_eq!(scrape(&app).await.get(EXHAUSTED, &labels("submit_job")), 1.0);
}
