//! Policies: a weight for users and tenants, and for users, tenants and services a cap on
//! running items and a rate limit on how fast items go out, set by operators and held exactly
//! by the claims of every broker together.

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

/// When each running item of a key went out, by the database's clock, in order: every leased
/// item has the same lease, so lease ends are claim times shifted alike. `key` is a condition on
/// the item's step (`uw`) naming $1.
async fn claim_times(app: &TestApp, key: &str, value: &str) -> Vec<DateTime<Utc>> {
    let query = format!(
        "SELECT w.lease_expires_at FROM work_items w
           JOIN user_work uw USING (job_id, step_index, component)
          WHERE w.status = 'running' AND {key}
          ORDER BY w.lease_expires_at"
    );
    let rows = app.db.query(&query, &[&value]).await.expect("claim times");
    rows.iter().map(|row| row.get(0)).collect()
}

/// In every window between two claims, no more than `burst + rate × t` items went out.
fn assert_paced(times: &[DateTime<Utc>], rate: f64, burst: i32) {
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

    let times = claim_times(&first, "uw.service = $1", "limited").await;
    assert_eq!(times.len(), handed_out);
    assert_paced(&times, rate, burst);
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

async fn put_user(app: &TestApp, user: &str, body: Value) -> (StatusCode, Value) {
    let path = format!("/admin/users/{user}");
    let response = app.request(Method::PUT, &path).json(&body).send().await.expect("PUT");
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

async fn user_policy(app: &TestApp, user: &str) -> (StatusCode, Value) {
    let response = app.get(&format!("/admin/users/{user}")).await;
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

async fn put_tenant(app: &TestApp, tenant: &str, body: Value) -> Value {
    let path = format!("/admin/tenants/{tenant}");
    let response = app.request(Method::PUT, &path).json(&body).send().await.expect("PUT");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("JSON")
}

/// The items running now whose step matches `key` (a condition on `uw` naming $1).
async fn running_where(app: &TestApp, key: &str, value: &str) -> i64 {
    claim_times(app, key, value).await.len() as i64
}

/// Claims with `query` until a claim comes back empty: with no other claimer, everything the
/// policies let out.
async fn drain(app: &TestApp, query: &str) -> Vec<Value> {
    let mut items = Vec::new();
    loop {
        let claimed = app.claim_with(query).await;
        if claimed.is_empty() {
            return items;
        }
        items.extend(claimed);
    }
}

async fn submit_for(app: &TestApp, user: &str, tenant: &str, service: &str, items: usize) {
    let items: Vec<Value> = (0..items).map(|n| json!({ "payload": { "n": n } })).collect();
    app.submit(json!({ "user": user, "tenant": tenant, "is_async": true,
                       "steps": [{ "service": service }], "items": items }))
        .await;
}

#[tokio::test]
async fn a_user_policy_is_set_before_work_arrives_and_kept_field_by_field() {
    let app = spawn_app().await;
    let (status, body) = user_policy(&app, "ann").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "user_not_found");

    let (status, body) = put_user(&app, "ann", json!({"weight": 3})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expected = json!({
        "user": "ann", "weight": 3, "tier": 3, "max_running": 0, "rate_per_second": 0.0,
        "burst": 1, "running": 0, "at_cap": false, "throttled_until": null
    });
    assert_eq!(body, expected);
    let (_, body) = put_user(&app, "ann", json!({"max_running": 1, "burst": 2})).await;
    assert_eq!((body["weight"].clone(), body["max_running"].clone()), (json!(3), json!(1)));
    assert_eq!(body["burst"], 2);
    assert_eq!(user_policy(&app, "ann").await, (StatusCode::OK, body));

    // The policy holds for the work that arrives after it: one item runs, and the user is
    // at its cap.
    app.submit_simple("ann", "svc", 3, true).await;
    assert!(app.claim("svc").await.is_some());
    assert!(app.claim("svc").await.is_none(), "ann is at her cap of 1");
    let (_, body) = user_policy(&app, "ann").await;
    assert_eq!((body["running"].clone(), body["at_cap"].clone()), (json!(1), json!(true)));

    let before = app.fingerprint().await;
    let refusals = [
        (json!({"weight": 0}), "weight"),
        (json!({"weight": 1001}), "weight"),
        (json!({"weight": 1.5}), "weight"),
        (json!({"max_running": -1}), "max_running"),
        (json!({"rate_per_second": -2}), "rate_per_second"),
        (json!({"burst": 0}), "burst"),
        (json!({"tier": 0}), "tier"),
        (json!({"tier": 6}), "tier"),
        (json!({"weight": 2, "colour": "red"}), "colour"),
    ];
    for (body, field) in refusals {
        let (status, answer) = put_user(&app, "ann", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_policy", "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")), "{body}: {message}");
    }
    assert_eq!(app.fingerprint().await, before, "a refused change changed nothing");
    let (status, _) = put_user(&app, "bob", json!({"weight": 0})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(user_policy(&app, "bob").await.0, StatusCode::NOT_FOUND, "no user was made");
}

#[tokio::test]
async fn backlogged_users_hold_running_items_in_proportion_to_their_weights() {
    let (single, batched) = (spawn_app().await, spawn_app().await);
    for app in [&single, &batched] {
        for (user, weight) in [("ann", 1), ("bob", 2), ("cid", 4)] {
            put_user(app, user, json!({ "weight": weight })).await;
            app.submit_simple(user, "svc", 20, true).await;
        }
    }
    // Fourteen workers, each taking one item: one at a time, and all in one batch.
    let mut one_at_a_time = Vec::new();
    for worker in 0..14 {
        let item = single.claim_with(&format!("service=svc&querier=pod-{worker}&worker=0")).await;
        one_at_a_time.push(item[0]["user"].as_str().expect("user").to_owned());
    }
    let batch: Vec<String> = batched
        .claim_with("service=svc&querier=pod-0&worker=0&max=14")
        .await
        .iter()
        .map(|item| item["user"].as_str().expect("user").to_owned())
        .collect();
    assert_eq!(batch, one_at_a_time, "a batch hands out what single claims would");
    let held = |user: &str| one_at_a_time.iter().filter(|held| *held == user).count();
    assert_eq!((held("ann"), held("bob"), held("cid")), (2, 4, 8));
    // Level by level: at each share, the users that started there, then those raised to it.
    let expected = ["ann", "bob", "cid", "cid", "bob", "cid", "cid"];
    assert_eq!(one_at_a_time[..7], expected);
    let app = single;
    // A weight change takes effect at the next claim: ann at 2 of weight 8 goes before cid at
    // 8 of weight 4.
    put_user(&app, "ann", json!({ "weight": 8 })).await;
    let next = app.claim("svc").await.expect("an item");
    assert_eq!(next["user"], "ann");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_user_cap_holds_across_two_brokers_and_every_strategy_and_others_are_served() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    // ann's work is the oldest, so that a strategy reading by age meets it first.
    first.submit_simple("ann", "svc", 10, true).await;
    for user in ["bob", "cid"] {
        first.submit_simple(user, "svc", 10, true).await;
    }
    put_user(&first, "ann", json!({"max_running": 2})).await;

    let brokers = [&first, &second];
    let mut handed_out = Vec::new();
    for round in 0..2 {
        let claims = (0..8).map(|worker| {
            let app = brokers[worker % 2];
            let strategy = if worker % 4 == 3 { "&strategy=%22oldest%22" } else { "" };
            let query =
                format!("service=svc&querier=pod-{round}-{worker}&worker=0&max=2{strategy}");
            async move { app.claim_with(&query).await }
        });
        handed_out.extend(join_all(claims).await.into_iter().flatten());
        assert!(running_where(&first, "uw.username = $1", "ann").await <= 2, "cap exceeded");
    }
    // What the racing workers passed over as held, one worker then takes, alone.
    handed_out.extend(drain(&second, "service=svc&querier=pod-last&worker=0&max=4").await);
    let ann = handed_out.iter().filter(|item| item["user"] == "ann").count();
    assert_eq!(ann, 2, "ann got exactly her cap");
    assert_eq!(handed_out.len(), 22, "the other users took the rest of the claims");

    // A freed slot goes back to ann at once: she is furthest behind.
    let mine = handed_out.iter().find(|item| item["user"] == "ann").expect("ann's item");
    second.succeed(mine, json!([])).await;
    assert_eq!(first.claim("svc").await.expect("an item")["user"], "ann");
    assert_eq!(user_policy(&second, "ann").await.1["running"], 2);
    first.assert_consistent().await;
}

#[tokio::test]
async fn a_long_poll_held_back_by_a_users_cap_wakes_when_its_slot_frees() {
    let app = spawn_app().await;
    app.submit_simple("ann", "svc", 5, true).await;
    put_user(&app, "ann", json!({"max_running": 1})).await;
    let first = app.claim("svc").await.expect("the first item");
    let waiting = tokio::spawn({
        let address = app.address.clone();
        async move {
            let started = Instant::now();
            let query = "service=svc&querier=pod-w&worker=0&wait=10";
            let response = reqwest::get(format!("{address}/work?{query}")).await.expect("GET");
            (response.status(), started.elapsed())
        }
    });
    app.await_waiting_workers("svc", 1).await;
    app.succeed(&first, json!([])).await;
    let (status, waited) = waiting.await.expect("the long poll");
    assert_eq!(status, StatusCode::OK);
    assert!(waited < Duration::from_secs(3), "woke {waited:?} after it asked");
    let metrics = app.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("fairway_claims_passed_over_total{reason=\"cap\"}")),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_tenant_cap_holds_across_two_brokers_and_other_tenants_are_served() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    for (user, tenant) in [("ann", "acme"), ("amy", "acme"), ("bob", "beta")] {
        submit_for(&first, user, tenant, "svc", 10).await;
    }
    let tenant = put_tenant(&first, "acme", json!({"max_running": 3, "weight": 2})).await;
    assert_eq!((tenant["max_running"].clone(), tenant["weight"].clone()), (json!(3), json!(2)));
    assert_eq!(tenant["max_queriers"], 0, "fields left out keep their value");

    let brokers = [&first, &second];
    let claims = (0..8).map(|worker| {
        let app = brokers[worker % 2];
        let query = format!("service=svc&querier=pod-{worker}&worker=0&max=2");
        async move { app.claim_with(&query).await }
    });
    let mut handed_out: Vec<Value> = join_all(claims).await.into_iter().flatten().collect();
    assert!(running_where(&first, "uw.tenant = $1", "acme").await <= 3, "cap exceeded");
    handed_out.extend(drain(&second, "service=svc&querier=pod-last&worker=0&max=4").await);
    let acme = handed_out.iter().filter(|item| item["tenant"] == "acme").count();
    assert_eq!(acme, 3, "acme got exactly its cap");
    assert_eq!(handed_out.len(), 13, "beta took the rest of what it had");
    assert_eq!(running_where(&first, "uw.tenant = $1", "acme").await, 3);
    let read = second.get("/admin/tenants/acme").await.json::<Value>().await.expect("JSON");
    assert_eq!((read["running"].clone(), read["at_cap"].clone()), (json!(3), json!(true)));
    first.assert_consistent().await;
}

#[tokio::test]
async fn user_and_tenant_rate_limits_hold_in_every_window_while_others_are_served() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    submit_for(&first, "ann", "free", "svc", 60).await;
    submit_for(&first, "tom", "slow", "svc", 60).await;
    submit_for(&first, "bob", "free", "svc", 200).await;
    put_user(&first, "ann", json!({"rate_per_second": 10.0, "burst": 3})).await;
    put_tenant(&first, "slow", json!({"rate_per_second": 5.0, "burst": 2})).await;

    let brokers = [&first, &second];
    let until = Instant::now() + Duration::from_millis(1500);
    let workers = (0..6).map(|worker| {
        let app = brokers[worker % 2];
        async move {
            let query = format!("service=svc&querier=pod-{worker}&worker=0&max=4&wait=1");
            let mut got = Vec::new();
            while Instant::now() < until {
                got.extend(app.claim_with(&query).await);
            }
            got
        }
    });
    let handed_out: Vec<Value> = join_all(workers).await.into_iter().flatten().collect();
    let ann = claim_times(&first, "uw.username = $1", "ann").await;
    assert_paced(&ann, 10.0, 3);
    let slow = claim_times(&first, "uw.tenant = $1", "slow").await;
    assert_paced(&slow, 5.0, 2);
    assert!(ann.len() >= 15, "ann's limit paces her items, it does not stop them: {}", ann.len());
    assert!(slow.len() >= 7, "slow's limit paces its items: {}", slow.len());
    let bob = handed_out.iter().filter(|item| item["user"] == "bob").count();
    assert!(bob > ann.len() + slow.len(), "bob was served meanwhile: {bob}");
    first.assert_consistent().await;
}

#[tokio::test]
async fn the_consistency_check_finds_policy_copies_that_would_strand_work() {
    let app = spawn_app().await;
    app.submit_simple("ann", "svc", 2, true).await;
    submit_for(&app, "bob", "acme", "svc", 2).await;
    put_tenant(&app, "acme", json!({"weight": 2})).await;
    app.assert_consistent().await;
    // A row that says its user's bucket is empty when it is not would keep her out of the order
    // for good; so would a cap or weight the user does not have, or a tenant weight.
    let drifts = [
        "UPDATE service_users SET throttled = true WHERE username = 'ann'",
        "UPDATE service_users SET max_running = 1, weight = 5 WHERE username = 'bob'",
        "UPDATE tenant_queues SET weight = 1 WHERE tenant = 'acme'",
    ];
    let expected = [
        ("service_users", "user", "ann"),
        ("service_users", "user", "bob"),
        ("tenant_queues", "tenant", "acme"),
    ];
    assert_mismatches_after(&app, &drifts, &expected).await;
}

/// Applies each of `drifts` to the database, then asserts that the consistency check finds
/// exactly the rows `expected` names, each as (table, key field, value).
async fn assert_mismatches_after(app: &TestApp, drifts: &[&str], expected: &[(&str, &str, &str)]) {
    for drift in drifts {
        app.db.execute(*drift, &[]).await.expect("drift");
    }
    let body: Value = app.get("/admin/consistency").await.json().await.expect("JSON");
    assert_eq!(body["consistent"], false, "{body:#}");
    let mismatches = body["mismatches"].as_array().expect("mismatches");
    assert_eq!(mismatches.len(), expected.len(), "{body:#}");
    for (table, field, value) in expected {
        assert!(
            mismatches.iter().any(|m| m["table"] == *table && m["key"][field] == *value),
            "no mismatch for {table} {value}: {body:#}"
        );
    }
}

#[tokio::test]
async fn backlogged_tenants_share_the_workers_in_proportion_to_their_weights() {
    let app = spawn_app().await;
    put_tenant(&app, "heavy", json!({"weight": 3})).await;
    submit_for(&app, "hana", "heavy", "svc", 20).await;
    submit_for(&app, "lars", "light", "svc", 20).await;
    let mut held = std::collections::BTreeMap::<String, usize>::new();
    for worker in 0..8 {
        let item = app.claim_with(&format!("service=svc&querier=pod-{worker}&worker=0")).await;
        *held.entry(item[0]["tenant"].as_str().expect("tenant").to_owned()).or_default() += 1;
    }
    assert_eq!((held["heavy"], held["light"]), (6, 2), "{held:?}");
    app.assert_consistent().await;
}

/// Six workers on two brokers serve `users`, each backlogged in `svc`: each worker ends its
/// item and asks again, the oldest first, `claims` times. Answers the items each user was
/// handed, by user.
async fn serve_six_workers(
    brokers: [&TestApp; 2],
    claims: usize,
) -> std::collections::BTreeMap<String, usize> {
    let mut served = std::collections::BTreeMap::<String, usize>::new();
    let mut running = std::collections::VecDeque::new();
    for claim in 0..claims {
        if running.len() == 6 {
            let item: Value = running.pop_front().expect("an item runs");
            brokers[claim % 2].succeed(&item, json!([])).await;
        }
        let query = format!("service=svc&querier=pod-{}&worker=0", claim % 6);
        let item = brokers[claim % 2].claim_with(&query).await.pop().expect("an item");
        *served.entry(item["user"].as_str().expect("user").to_owned()).or_default() += 1;
        running.push_back(item);
    }
    served
}

#[tokio::test]
async fn weights_buy_turns_where_users_outnumber_workers_across_two_brokers() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    // Thirty users weighted 1, 2 and 4, ten of each, through six workers: each holds one item
    // at most, so every share ties at 0 and the turns decide.
    let weight_of = |user: usize| [1, 2, 4][user % 3];
    for user in 0..30 {
        let name = format!("u{user:02}");
        put_user(&first, &name, json!({ "weight": weight_of(user) })).await;
        first.submit_simple(&name, "svc", 40, true).await;
    }
    let served = serve_six_workers([&first, &second], 280).await;
    let mean = |weight: usize| {
        let users: Vec<usize> = (0..30).filter(|user| weight_of(*user) == weight).collect();
        let items: usize =
            users.iter().map(|user| served.get(&format!("u{user:02}")).copied().unwrap_or(0)).sum();
        items as f64 / users.len() as f64
    };
    let (one, two, four) = (mean(1), mean(2), mean(4));
    assert!((1.7..=2.3).contains(&(two / one)), "weight 2 got {two} to weight 1's {one}");
    assert!((3.4..=4.6).contains(&(four / one)), "weight 4 got {four} to weight 1's {one}");
    // Weighted Jain's index over every user: 1.0 when each gets its weight's share.
    let shares: Vec<f64> = (0..30)
        .map(|user| {
            let items = served.get(&format!("u{user:02}")).copied().unwrap_or(0);
            items as f64 / weight_of(user) as f64
        })
        .collect();
    let sum: f64 = shares.iter().sum();
    let jain = sum * sum / (shares.len() as f64 * shares.iter().map(|x| x * x).sum::<f64>());
    assert!(jain >= 0.95, "weighted Jain's index {jain:.3}: {served:?}");
    first.assert_consistent().await;
}

#[tokio::test]
async fn a_heavy_user_arriving_late_gets_its_weighted_share_and_no_more() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    for user in 0..20 {
        first.submit_simple(&format!("u{user:02}"), "svc", 60, true).await;
    }
    serve_six_workers([&first, &second], 60).await;
    // A user weighted 4 arrives among twenty weighted 1: a weighted share of 4 / 24 of what
    // follows, starting at the order's clock, with no credit for the time before it came.
    put_user(&first, "late", json!({"weight": 4})).await;
    first.submit_simple("late", "svc", 200, true).await;
    let served = serve_six_workers([&second, &first], 240).await;
    let late = served.get("late").copied().unwrap_or(0);
    assert!((32..=48).contains(&late), "late got {late} of 240, its share being 40: {served:?}");
    first.assert_consistent().await;
}

#[tokio::test]
async fn tiers_go_first_within_a_tenant_and_among_tenants_across_two_brokers() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    submit_for(&first, "ann", "acme", "svc", 10).await;
    submit_for(&first, "vip", "acme", "svc", 10).await;
    submit_for(&first, "bob", "beta", "svc", 10).await;
    let (status, body) = put_user(&first, "vip", json!({"tier": 1})).await;
    assert_eq!((status, body["tier"].clone()), (StatusCode::OK, json!(1)), "{body}");
    let acme = put_tenant(&second, "acme", json!({"tier": 2, "weight": 2})).await;
    assert_eq!((acme["tier"].clone(), acme["weight"].clone()), (json!(2), json!(2)));
    assert_eq!(user_policy(&second, "vip").await.1["tier"], 1);

    // acme's tier puts it before beta however much it runs, and within acme vip goes first.
    let brokers = [&first, &second];
    let claims = (0..8).map(|worker| {
        let app = brokers[worker % 2];
        let query = format!("service=svc&querier=pod-{worker}&worker=0&max=2");
        async move { app.claim_with(&query).await }
    });
    let handed_out: Vec<Value> = join_all(claims).await.into_iter().flatten().collect();
    let count = |key: &str, value: &str| handed_out.iter().filter(|i| i[key] == value).count();
    assert_eq!(handed_out.len(), 16);
    assert_eq!((count("user", "vip"), count("user", "ann")), (10, 6), "vip first, then ann");
    assert_eq!(count("tenant", "beta"), 0, "beta waits for the higher tier");
    first.assert_consistent().await;
}

#[tokio::test]
async fn the_consistency_check_finds_tier_copies_and_passes_ahead_of_their_clock() {
    let app = spawn_app().await;
    submit_for(&app, "ann", "acme", "svc", 2).await;
    submit_for(&app, "bob", "beta", "svc", 2).await;
    app.claim("svc").await.expect("an item");
    app.claim("svc").await.expect("an item");
    app.assert_consistent().await;
    // A tier the user or tenant does not have would misplace it in the order; a pass more than
    // a stride past its order's clock would hold its row back for as long.
    let drifts = [
        "UPDATE service_users SET tier = 1 WHERE username = 'ann'",
        "UPDATE tenant_queues SET tier = 5 WHERE tenant = 'beta'",
        "UPDATE service_users SET pass = 9000000 WHERE username = 'bob'",
    ];
    let expected = [
        ("service_users", "user", "ann"),
        ("tenant_queues", "tenant", "beta"),
        ("service_users", "user", "bob"),
    ];
    assert_mismatches_after(&app, &drifts, &expected).await;
}
