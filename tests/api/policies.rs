//! Service policies: a cap on a service's running items and a rate limit on how fast its items
//! go out, set by operators and held exactly by the claims of every broker together.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use fairway_server::config::ServeArgs;
use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_broker, TestApp};

async fn put_policy(app: &TestApp, service: &str, body: Value) -> (StatusCode, Value) {
    let path = format!("/admin/services/{service}");
    let response = app.request(Method::PUT, &path).json(&body).send().await.expect("PUT");
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

async fn policy(app: &TestApp, service: &str) -> (StatusCode, Value) {
    let response = app.get(&format!("/admin/services/{service}")).await;
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

/// The service's items running now, read from the items.
async fn running(app: &TestApp, service: &str) -> i64 {
    app.db
        .query_one(
            "SELECT count(*) FROM work_items w
               JOIN user_work uw USING (job_id, step_index, component)
              WHERE w.status = 'running' AND uw.service = $1",
            &[&service],
        )
        .await
        .expect("count running")
        .get(0)
}

#[tokio::test]
async fn a_service_policy_is_set_before_work_arrives_and_kept_field_by_field() {
    let app = spawn_app().await;
    let (status, body) = policy(&app, "render").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "service_not_found");

    let (status, body) = put_policy(&app, "render", json!({"max_running": 3})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expected = json!({
        "service": "render", "max_running": 3, "rate_per_second": 0.0, "burst": 1, "running": 0
    });
    assert_eq!(body, expected);

    let (_, body) = put_policy(&app, "render", json!({"rate_per_second": 2.5, "burst": 4})).await;
    assert_eq!(
        (body["max_running"].clone(), body["rate_per_second"].clone()),
        (json!(3), json!(2.5))
    );
    assert_eq!(body["burst"], 4);
    let (status, read) = policy(&app, "render").await;
    assert_eq!((status, read), (StatusCode::OK, body));

    // A service a job names has the defaults until a policy is set.
    app.submit_simple("ann", "subset", 2, true).await;
    app.claim("subset").await.expect("an item");
    let (status, body) = policy(&app, "subset").await;
    assert_eq!(status, StatusCode::OK);
    let expected = json!({
        "service": "subset", "max_running": 0, "rate_per_second": 0.0, "burst": 1, "running": 1
    });
    assert_eq!(body, expected);
}

#[tokio::test]
async fn bad_policy_values_are_refused_naming_the_field_and_change_nothing() {
    let app = spawn_app().await;
    let (_, before) = put_policy(&app, "render", json!({"max_running": 2, "burst": 3})).await;
    let refusals = [
        (json!({"max_running": -1}), "max_running"),
        (json!({"max_running": 2.5}), "max_running"),
        (json!({"rate_per_second": -1}), "rate_per_second"),
        (json!({"rate_per_second": "fast"}), "rate_per_second"),
        (json!({"rate_per_second": 1e-300}), "rate_per_second"),
        (json!({"burst": 0}), "burst"),
        (json!({"max_running": 5, "burst": 0}), "burst"),
        (json!({"max_runing": 5}), "max_runing"),
    ];
    for (body, field) in refusals {
        let (status, answer) = put_policy(&app, "render", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_policy", "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")), "{body}: {message}");
    }
    assert_eq!(policy(&app, "render").await.1, before, "a refused change changed nothing");
}

#[tokio::test]
async fn a_cap_holds_exactly_across_two_brokers_and_a_freed_slot_wakes_a_long_poll() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    for user in ["ann", "bob", "cid"] {
        first.submit_simple(user, "capped", 10, true).await;
    }
    put_policy(&first, "capped", json!({"max_running": 4})).await;

    // Twelve workers on two brokers, each asking for two items at once, three times over.
    let brokers = [&first, &second];
    let mut handed_out = Vec::new();
    for _ in 0..3 {
        let claims = (0..12).map(|worker| {
            let app = brokers[worker % 2];
            let query = format!("service=capped&querier=pod-{worker}&worker=0&max=2&wait=0");
            async move { app.claim_with(&query).await }
        });
        handed_out.extend(join_all(claims).await.into_iter().flatten());
        assert!(running(&first, "capped").await <= 4, "the cap was exceeded");
    }
    assert_eq!(handed_out.len(), 4, "exactly the cap's four items went out");
    assert_eq!(running(&first, "capped").await, 4);
    assert_eq!(policy(&second, "capped").await.1["running"], 4);

    // A long poll held back by the cap gets the slot an ending frees, on the other broker.
    let waiting = tokio::spawn({
        let query = "service=capped&querier=pod-w&worker=0&wait=10";
        let second = second.address.clone();
        async move {
            let started = Instant::now();
            let response = reqwest::get(format!("{second}/work?{query}")).await.expect("GET");
            (response.status(), started.elapsed())
        }
    });
    second.await_waiting_workers("capped", 1).await;
    first.succeed(&handed_out[0], json!([])).await;
    let (status, waited) = waiting.await.expect("the long poll");
    assert_eq!(status, StatusCode::OK);
    assert!(waited < Duration::from_secs(3), "woke {waited:?} after it asked");
    assert_eq!(running(&first, "capped").await, 4);

    let metrics = first.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("fairway_claims_passed_over_total{reason=\"cap\"}")),
        "{metrics}"
    );
    first.assert_consistent().await;
}

/// When each item of `service` went out, by the database's clock, in order.
async fn claim_times(app: &TestApp, service: &str) -> Vec<DateTime<Utc>> {
    let rows = app
        .db
        .query(
            "SELECT w.lease_expires_at FROM work_items w
               JOIN user_work uw USING (job_id, step_index, component)
              WHERE w.status = 'running' AND uw.service = $1
              ORDER BY w.lease_expires_at",
            &[&service],
        )
        .await
        .expect("claim times");
    rows.iter().map(|row| row.get(0)).collect()
}

#[tokio::test]
async fn a_rate_limit_holds_in_every_window_across_two_brokers() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    first.submit_simple("ann", "limited", 60, true).await;
    first.submit_simple("bob", "limited", 60, true).await;
    let (rate, burst) = (10.0, 3);
    put_policy(&first, "limited", json!({"rate_per_second": rate, "burst": burst})).await;

    // Eight workers on two brokers long-poll for 1.5 s, taking whatever the limit lets out.
    let brokers = [&first, &second];
    let until = Instant::now() + Duration::from_millis(1500);
    let workers = (0..8).map(|worker| {
        let app = brokers[worker % 2];
        async move {
            let query = format!("service=limited&querier=pod-{worker}&worker=0&max=4&wait=1");
            let mut got = 0;
            while Instant::now() < until {
                got += app.claim_with(&query).await.len();
            }
            got
        }
    });
    let handed_out: usize = join_all(workers).await.into_iter().sum();

    // Every leased item has the same lease, so lease ends are claim times shifted alike.
    let times = claim_times(&first, "limited").await;
    assert_eq!(times.len(), handed_out);
    for (i, start) in times.iter().enumerate() {
        for (j, end) in times.iter().enumerate().skip(i) {
            let window = (*end - *start).num_microseconds().expect("short") as f64 / 1e6;
            let items = (j - i + 1) as f64;
            assert!(
                items <= f64::from(burst) + rate * window + 1e-9,
                "{items} items went out within {window} s"
            );
        }
    }
    // The limit paces the items; it does not stop them: the polls asked for 1.5 s (the last
    // may wait a second more), and 1.5 s alone let out 3 + 15.
    assert!(handed_out >= 15, "only {handed_out} items went out in 1.5 s or more");
    first.assert_consistent().await;
}

#[tokio::test]
async fn a_long_poll_held_back_by_a_rate_gets_its_item_when_it_is_due() {
    let app = spawn_app().await;
    app.submit_simple("ann", "slow", 5, true).await;
    put_policy(&app, "slow", json!({"rate_per_second": 2, "burst": 1})).await;
    assert!(app.claim("slow").await.is_some(), "the bucket starts full");
    assert!(app.claim("slow").await.is_none(), "the next item is half a second away");

    let started = Instant::now();
    let items = app.claim_with("service=slow&querier=pod-0&worker=1&wait=5").await;
    let waited = started.elapsed();
    assert_eq!(items.len(), 1);
    assert!(waited < Duration::from_millis(1500), "waited {waited:?} for an item due in 0.5 s");
}
