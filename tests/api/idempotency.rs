//! Idempotent submissions: `POST /jobs` with an `Idempotency-Key` header.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairway_server::config::ServeArgs;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, spawn_broker, TestApp};

fn job(user: &str, items: usize) -> Value {
    let items: Vec<Value> = (0..items).map(|n| json!({ "payload": { "n": n } })).collect();
    json!({ "user": user, "steps": [{ "service": "svc" }], "items": items })
}

/// POST /jobs with `key`; the status, the replay header, and the body.
async fn submit_keyed(app: &TestApp, key: &str, body: &Value) -> (StatusCode, bool, Value) {
    let response = app
        .request(reqwest::Method::POST, "/jobs")
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("POST /jobs");
    let status = response.status();
    let replayed = response
        .headers()
        .get("Idempotent-Replayed")
        .is_some_and(|value| value.as_bytes() == b"true");
    (status, replayed, response.json().await.expect("JSON"))
}

async fn count(app: &TestApp, table: &str) -> i64 {
    let query = format!("SELECT count(*) FROM {table}");
    app.db.query_one(&query, &[]).await.expect("count").get(0)
}

#[tokio::test]
async fn the_same_request_again_gets_the_first_answer_and_creates_nothing() {
    let app = spawn_app().await;
    let (status, replayed, first) = submit_keyed(&app, "order-17", &job("alice", 3)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let before = app.fingerprint().await;

    // The same JSON value, keys in another order and spaced otherwise.
    let reordered: Value = serde_json::from_str(
        r#"{ "items": [{"payload": {"n": 0}}, {"payload": {"n": 1}}, {"payload": {"n": 2}}],
             "steps": [{"service": "svc"}], "user": "alice" }"#,
    )
    .expect("JSON");
    let (status, replayed, again) = submit_keyed(&app, "order-17", &reordered).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first);
    assert_eq!(app.fingerprint().await, before, "a replay stores nothing");

    // Another request with the key is refused, and stores nothing either.
    let (status, _, error) = submit_keyed(&app, "order-17", &job("alice", 4)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error["error"]["code"], "idempotency_key_reused");
    assert_eq!(app.fingerprint().await, before);
    assert_eq!(count(&app, "jobs").await, 1);
    app.assert_consistent().await;
}

#[tokio::test]
async fn keys_are_scoped_to_the_jobs_user_with_auth_off() {
    let app = spawn_app().await;
    let (_, _, alice) = submit_keyed(&app, "k", &job("alice", 1)).await;
    let (status, replayed, bob) = submit_keyed(&app, "k", &job("bob", 1)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_ne!(alice["job_id"], bob["job_id"]);
    assert_eq!(count(&app, "jobs").await, 2);
}

#[tokio::test]
async fn a_bad_key_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let before = app.fingerprint().await;
    let long = "k".repeat(256);
    for key in ["", long.as_str(), "tab\there"] {
        let (status, _, error) = submit_keyed(&app, key, &job("alice", 1)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "key {key:?}");
        assert_eq!(error["error"]["code"], "invalid_idempotency_key");
    }
    assert_eq!(app.fingerprint().await, before);
    let (status, _, _) = submit_keyed(&app, &"k".repeat(255), &job("alice", 1)).await;
    assert_eq!(status, StatusCode::CREATED, "255 characters are allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_requests_at_two_brokers_create_one_job() {
    const REQUESTS: usize = 40;
    let first = Arc::new(spawn_app().await);
    let second = Arc::new(spawn_broker(ServeArgs::for_tests(), first.config.clone()).await);
    let body = job("alice", 5);
    let mut tasks = Vec::new();
    for request in 0..REQUESTS {
        let app = if request % 2 == 0 { first.clone() } else { second.clone() };
        let body = body.clone();
        tasks.push(tokio::spawn(async move { submit_keyed(&app, "once", &body).await }));
    }
    let mut created = 0;
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        let (status, replayed, answer) = task.await.expect("request");
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        created += usize::from(!replayed);
        ids.insert(answer["job_id"].as_str().expect("job_id").to_owned());
    }
    assert_eq!(created, 1, "one request created the job, the others were replayed");
    assert_eq!(ids.len(), 1, "every answer names the same job");
    assert_eq!(count(&first, "jobs").await, 1);
    assert_eq!(count(&first, "work_items").await, 5);
    first.assert_consistent().await;
}

#[tokio::test]
async fn expired_keys_are_pruned_with_finished_jobs_and_may_be_used_again() {
    let mut args = ServeArgs::for_tests();
    args.idempotency_ttl = Duration::from_millis(300);
    let app = spawn_app_with(args).await;
    let (_, _, first) = submit_keyed(&app, "k", &job("alice", 1)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let expired = "SELECT bool_and(expires_at <= now()) FROM idempotency_keys";
    while !app.db.query_one(expired, &[]).await.expect("keys").get::<_, bool>(0) {
        assert!(Instant::now() < deadline, "the key never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.broker
        .maintenance()
        .prune_finished_jobs(Duration::from_secs(3600))
        .await
        .expect("a pruning pass");
    assert_eq!(count(&app, "idempotency_keys").await, 0, "the expired key was pruned");
    let (status, replayed, second) = submit_keyed(&app, "k", &job("alice", 2)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_ne!(first["job_id"], second["job_id"]);
    app.assert_consistent().await;
}
