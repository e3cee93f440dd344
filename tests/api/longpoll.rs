//! Long polling: idle workers wait, and wake when work for their service arrives.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::spawn_app;

/// The generous bound the issue names for a wake-up on a shared machine.
const WAKE_UP_BOUND: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_worker_wakes_when_a_job_is_submitted() {
    let app = std::sync::Arc::new(spawn_app().await);
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move {
            let items = app.claim_with("service=svc&querier=pod-0&wait=30").await;
            (Instant::now(), items)
        })
    };
    // Submit only once the worker is really waiting, so the wake-up path is what's measured.
    app.await_waiting_workers("svc", 1).await;
    app.submit_simple("alice", "svc", 1, true).await;
    let submitted = Instant::now();
    let (claimed_at, items) = waiter.await.expect("waiter");
    assert_eq!(items.len(), 1);
    let delay = claimed_at.saturating_duration_since(submitted);
    assert!(delay < WAKE_UP_BOUND, "woke {delay:?} after the job was submitted");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_waiting_worker_ignores_other_services_and_gives_up_after_wait() {
    let app = spawn_app().await;
    app.submit_simple("alice", "other", 1, true).await;
    let started = Instant::now();
    let response = app.get("/work?service=svc&querier=pod-0&wait=1").await;
    assert_eq!(response.status(), 204);
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited for the whole second");
    let waiting: Value = app.get("/admin/waiting-workers").await.json().await.expect("JSON");
    assert_eq!(waiting["services"]["svc"], 0, "a worker that gave up is no longer counted");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_service_no_job_has_named_still_gets_204_with_a_header_saying_so() {
    let app = spawn_app().await;
    let unknown = app.get("/work?service=wtypo&querier=pod-0").await;
    assert_eq!(unknown.status(), reqwest::StatusCode::NO_CONTENT);
    let header = unknown.headers().get("fairway-unknown-service").cloned();
    assert_eq!(header.as_ref().and_then(|h| h.to_str().ok()), Some("wtypo"));

    app.submit_simple("alice", "known", 1, true).await;
    app.claim("known").await.expect("the item");
    let idle = app.get("/work?service=known&querier=pod-0").await;
    assert_eq!(idle.status(), reqwest::StatusCode::NO_CONTENT);
    assert!(idle.headers().get("fairway-unknown-service").is_none(), "a named, idle service");
}
