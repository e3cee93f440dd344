//! Failures, retries, heartbeats and expired leases.

use fairway_server::config::ServeArgs;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{spawn_app, spawn_app_with, spawn_broker, TestApp};

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
    let after = lease(&app.db.query_one(sql, &[]).await.expect("row"));
    assert!(after > before, "lease moved from {before} to {after}");
    // The answer says when the lease now ends.
    let answered: chrono::DateTime<chrono::Utc> =
        body["lease_expires_at"].as_str().expect("a time").parse().expect("RFC 3339");
    assert_eq!(answered, after);
    assert_eq!((&body["id"], &body["status"]), (&item["id"], &json!("running")), "{body}");
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

/// Sums a counter's samples in a broker's /metrics text.
async fn counter_total(app: &TestApp, name: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("metrics text");
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A node of 500 workers dies at once: three brokers' reapers, racing, put every lease back
/// well within two seconds of its expiry, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_leases_expiring_together_are_back_within_two_seconds() {
    const USERS: usize = 10;
    const PER_USER: usize = 50;
    const LEASES: i64 = (USERS * PER_USER) as i64;
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    let third = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    for user in 0..USERS {
        first.submit_simple(&format!("user-{user}"), "svc", PER_USER, true).await;
    }
    let mut held = 0;
    for worker in 0..20 {
        held += first
            .claim_with(&format!("service=svc&querier=pod-{}&worker={worker}&max=25", worker % 4))
            .await
            .len();
    }
    assert_eq!(held as i64, LEASES);

    // Every lease runs out at the same instant, a little ahead, as when a node's workers all
    // stopped heartbeating together.
    let expiry: std::time::SystemTime = first
        .db
        .query_one(
            "WITH expiring AS (
                 UPDATE work_items SET lease_expires_at = date_trunc('milliseconds', now())
                                                          + interval '1500 milliseconds'
                 RETURNING lease_expires_at)
             SELECT max(lease_expires_at) FROM expiring",
            &[],
        )
        .await
        .expect("the node's leases run out together")
        .get(0);
    let ready = "SELECT count(*) FILTER (WHERE status = 'ready'), max(attempt) FROM work_items";
    let deadline = Instant::now() + Duration::from_secs(30);
    let back = loop {
        let row = first.db.query_one(ready, &[]).await.expect("items");
        if row.get::<_, i64>(0) == LEASES {
            break std::time::SystemTime::now();
        }
        assert!(Instant::now() < deadline, "the expired leases never all came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = back.duration_since(expiry).unwrap_or_default();
    println!("{LEASES} expired leases back in {took:?} after their expiry");
    assert!(took < Duration::from_secs(2), "took {took:?}");

    // Each lease was ended once, by one reaper: the brokers' counts add up to the leases, and
    // every item is ready at its first attempt.
    let row = first.db.query_one(ready, &[]).await.expect("items");
    assert_eq!(row.get::<_, i32>(1), 1, "no item's attempt moved twice");
    let mut expired = 0.0;
    for app in [&first, &second, &third] {
        expired += counter_total(app, "fairway_lease_expirations_total").await;
    }
    assert_eq!(expired, LEASES as f64, "each lease was released exactly once");
    first.assert_consistent().await;

    // And every item is claimable again, at its second attempt.
    let mut again = 0;
    for worker in 0..20 {
        let items = second
            .claim_with(&format!("service=svc&querier=pod-{}&worker={worker}&max=25", worker % 4))
            .await;
        assert!(items.iter().all(|item| item["attempt"] == 2));
        again += items.len();
    }
    assert_eq!(again as i64, LEASES);
    second.assert_consistent().await;
}

/// A broker judges no lease by its own clock: with its clock run on an hour (tokio's clock,
/// which its reaper and every timer of it follow, as after a long pause or an outage of the
/// database), a lease the database's clock has not seen run out is still held, and the worker's
/// report applies.
#[tokio::test]
async fn a_broker_whose_clock_ran_on_expires_no_lease_the_database_has_not_seen_run_out() {
    let args = ServeArgs { reap_interval: Duration::from_millis(50), ..ServeArgs::for_tests() };
    let app = spawn_app_with(args).await;
    app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("an item");

    // Every timer of the broker that lives in this runtime fires as if an hour had gone by.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(3600)).await;
    tokio::time::resume();
    let reaped = app.broker.maintenance().reap_expired_leases(500).await.expect("a reaper pass");
    assert_eq!(reaped, 0, "a lease was ended by the broker's clock");

    let id = item["id"].as_i64().expect("an id");
    let row = app
        .db
        .query_one("SELECT status::text, attempt FROM work_items WHERE id = $1", &[&id])
        .await
        .expect("the item");
    let (status, attempt): (String, i32) = (row.get(0), row.get(1));
    assert_eq!((status.as_str(), attempt), ("running", 1));
    app.succeed(&item, json!([])).await;
    app.assert_consistent().await;
}
