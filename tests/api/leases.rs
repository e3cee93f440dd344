//! Failures, retries, heartbeats and expired leases.

use fairway_server::config::ServeArgs;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{spawn_app, spawn_app_with};

#[tokio::test]
async fn a_retryable_failure_is_retried_until_the_limit() {
    let mut args = ServeArgs::for_tests();
    args.max_retries = 2;
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    for attempt in 1..=3 {
        let item = app.claim("svc").await.expect("the item again");
        assert_eq!(item["attempt"], attempt);
        let response = app
            .report(&item, json!({ "status": "failed", "attempt": attempt, "error": "flaky" }))
            .await;
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.expect("JSON");
        let expected = if attempt < 3 { "ready" } else { "failed" };
        assert_eq!(body["status"], expected, "after attempt {attempt}");
    }
    assert!(app.claim("svc").await.is_none(), "no fourth attempt");
    assert_eq!(app.job(job).await["status"], "failed");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_non_retryable_failure_fails_at_once() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    let response = app
        .report(
            &item,
            json!({ "status": "failed", "attempt": 1, "error": "bad input", "retryable": false }),
        )
        .await;
    let body: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(body["status"], "failed");
    assert!(app.claim("svc").await.is_none());
    assert_eq!(app.job(job).await["status"], "failed");
    let row = app.db.query_one("SELECT error FROM work_items", &[]).await.expect("row");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("bad input"));
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_and_the_stale_worker_is_refused() {
    let mut args = ServeArgs::for_tests();
    // Long enough that the second lease outlives the checks below on a loaded machine.
    args.lease = Duration::from_secs(2);
    args.reap_interval = Duration::from_millis(50);
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let stale = app.claim("svc").await.expect("item");
    assert_eq!(stale["attempt"], 1);

    // A long poll returns as soon as the reaper puts the item back.
    let fresh = app
        .claim_with("service=svc&querier=pod-1&wait=10")
        .await
        .pop()
        .expect("the reclaimed item");
    assert_eq!(fresh["id"], stale["id"]);
    assert_eq!(fresh["attempt"], 2);

    // With nothing ready, the reaper retires the tenant's queue: awaited, so that it does not
    // happen between the fingerprints (it once did, on a loaded machine). It goes on
    // recounting the lone tenant's running items meanwhile.
    app.await_idle_tenant_queues_retired().await;
    let before = app.fingerprint_apart_from_tenant_hints().await;
    for body in [
        json!({ "status": "successful", "attempt": 1, "results": [] }),
        json!({ "status": "running", "attempt": 1 }),
        json!({ "status": "failed", "attempt": 1 }),
    ] {
        let response = app.report(&stale, body).await;
        assert_eq!(response.status(), 409);
        let error: serde_json::Value = response.json().await.expect("JSON");
        assert_eq!(error["error"]["code"], "stale_attempt");
    }
    assert_eq!(
        app.fingerprint_apart_from_tenant_hints().await,
        before,
        "refused updates change nothing"
    );

    app.succeed(&fresh, json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

/// A pass over more expired leases than one transaction ends (a dead worker pod's, say) puts
/// every item back once, each with its attempt counted, whatever transaction it fell in.
#[tokio::test]
async fn a_reaper_pass_ends_every_expired_lease_of_a_dead_pod() {
    let mut args = ServeArgs::for_tests();
    // The pass below is the only one.
    args.reap_interval = Duration::from_secs(3600);
    let app = spawn_app_with(args).await;
    for user in ["alice", "bob", "carol"] {
        app.submit_simple(user, "svc", 30, true).await;
    }
    let mut held = 0;
    for worker in 0..3 {
        held += app
            .claim_with(&format!("service=svc&querier=pod-0&worker={worker}&max=30"))
            .await
            .len();
    }
    assert_eq!(held, 90);
    app.db
        .execute("UPDATE work_items SET lease_expires_at = now() - interval '1 second'", &[])
        .await
        .expect("the pod's leases run out");
    let reaped = app.broker.maintenance().reap_expired_leases(500).await.expect("a reaper pass");
    assert_eq!(reaped, 90);
    let row = app
        .db
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'ready' AND attempt = 1), count(*)
               FROM work_items",
            &[],
        )
        .await
        .expect("items");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (90, 90), "every item is back, once");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_heartbeat_extends_the_lease() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    let lease = |app_db: &tokio_postgres::Row| app_db.get::<_, chrono::DateTime<chrono::Utc>>(0);
    let sql = "SELECT lease_expires_at FROM work_items";
    let before = lease(&app.db.query_one(sql, &[]).await.expect("row"));
    let response = app.report(&item, json!({ "status": "running", "attempt": 1 })).await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(body, json!({ "id": item["id"], "status": "running" }));
    let after = lease(&app.db.query_one(sql, &[]).await.expect("row"));
    assert!(after > before, "lease moved from {before} to {after}");
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_update_on_a_finished_item_is_refused() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!([])).await;
    let before = app.fingerprint().await;
    let response = app.report(&item, json!({ "status": "failed", "attempt": 1 })).await;
    assert_eq!(response.status(), 409);
    let error: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "item_finished");
    assert_eq!(app.fingerprint().await, before);
    app.assert_consistent().await;
}
