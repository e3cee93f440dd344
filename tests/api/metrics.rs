//! `GET /metrics`, read with Prometheus' own parser (prometheus_client, from the virtualenv
//! `make test` sets up under target/), as items are submitted, claimed, finished, paused and
//! canceled.

use fairway_server::config::ServeArgs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::helpers::{spawn_app, spawn_app_with, spawn_broker, TestApp};

#[derive(Debug, Deserialize)]
pub struct Sample {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: Option<f64>,
}

/// The Python of the virtualenv `make test` creates, which has prometheus_client.
pub fn python() -> String {
    std::env::var("FAIRWAY_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/pytools/bin/python").into()
    })
}

/// Parses an exposition with prometheus_client; panics on anything it rejects.
pub async fn parse(text: &str) -> Vec<Sample> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/metrics_samples.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!("run {} ({error}); `make test` creates the virtualenv", python())
        });
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("write the exposition");
    drop(stdin);
    let output = child.wait_with_output().await.expect("parser output");
    assert!(
        output.status.success(),
        "prometheus_client rejected the exposition: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("samples JSON")
}

pub struct Scrape(pub Vec<Sample>);

impl Scrape {
    /// The value of the one sample named `name` whose labels include `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<&Sample> = self
            .0
            .iter()
            .filter(|sample| sample.name == name)
            .filter(|sample| {
                labels.iter().all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(v))
            })
            .collect();
        assert!(matching.len() <= 1, "{name} {labels:?} matches several samples: {matching:?}");
        matching.first().and_then(|sample| sample.value)
    }

    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
    }
}

pub async fn scrape(app: &TestApp) -> Scrape {
    let response = app.get("/metrics").await;
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().expect("ASCII").to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    Scrape(parse(&response.text().await.expect("body")).await)
}

/// Scrapes until `done` holds, for metrics fed off the request path.
pub async fn scrape_until(app: &TestApp, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scraped = scrape(app).await;
        if done(&scraped) {
            return scraped;
        }
        assert!(Instant::now() < deadline, "{what} never showed in /metrics");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn items(service: &str, state: &str) -> Vec<(&'static str, String)> {
    vec![("service", service.to_owned()), ("state", state.to_owned())]
}

fn pairs<'a>(labels: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test]
async fn metrics_follow_items_through_their_lives() {
    let mut args = ServeArgs::for_tests();
    // Every scrape reads the database again, so that each step below shows at once.
    args.metrics.metrics_refresh = Duration::ZERO;
    let app = spawn_app_with(args).await;
    let svc = "metered";

    let scraped = scrape(&app).await;
    let revision = fairway_broker::db::functions::REVISION.to_string();
    let migration = fairway_broker::db::migrations::latest();
    let build = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("functions_revision", revision.as_str()),
        ("schema_migration", migration.as_str()),
    ];
    assert_eq!(scraped.get("fairway_build_info", &build), 1.0);
    assert_eq!(scraped.value("fairway_work_items", &pairs(&items(svc, "ready"))), None);
    assert_eq!(scraped.get("fairway_db_pool_max_connections", &[]), 40.0);

    let alice = app.submit_simple("alice", svc, 5, true).await;
    let bob = app.submit_simple("bob", svc, 2, true).await;
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "ready"))), 7.0);
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "running"))), 0.0);
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "paused"))), 0.0);
    assert_eq!(scraped.get("fairway_active_users", &[("service", svc)]), 2.0);
    let age = scraped.get("fairway_oldest_ready_age_seconds", &[("service", svc)]);
    assert!((0.0..60.0).contains(&age), "oldest ready age {age}");

    let claimed = app.claim_with(&format!("service={svc}&querier=pod-0&max=2")).await;
    assert_eq!(claimed.len(), 2);
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "ready"))), 5.0);
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "running"))), 2.0);
    assert_eq!(scraped.get("fairway_claims_total", &[("service", svc), ("outcome", "item")]), 1.0);
    assert!(scraped.get("fairway_claim_duration_seconds_count", &[]) >= 1.0);
    assert!(scraped.get("fairway_batch_size_count", &[("kind", "claim")]) >= 1.0);

    app.succeed(&claimed[0], json!(["done"])).await;
    let failed = app
        .report(&claimed[1], json!({ "status": "failed", "attempt": 1, "error": "try again" }))
        .await;
    assert_eq!(failed.status(), StatusCode::OK);
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "ready"))), 6.0);
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "running"))), 0.0);
    let finished = |status| [("service", svc), ("status", status)];
    assert_eq!(scraped.get("fairway_work_items_finished_total", &finished("successful")), 1.0);
    assert_eq!(scraped.get("fairway_work_items_finished_total", &finished("retried")), 1.0);
    assert_eq!(scraped.get("fairway_batch_size_count", &[("kind", "ending")]), 2.0);
    let route = [("route", "/work/{id}/status"), ("code", "200")];
    assert_eq!(scraped.get("fairway_http_requests_total", &route), 2.0);
    assert_eq!(
        scraped
            .get("fairway_http_request_duration_seconds_count", &[("route", "/work/{id}/status")]),
        2.0
    );

    // Both claimed items were first attempts: their waits are read off the claim path.
    scrape_until(&app, "the queue waits", |scraped| {
        scraped.value("fairway_queue_wait_seconds_count", &[("service", svc)]) == Some(2.0)
    })
    .await;

    let paused = app.post(&format!("/jobs/{bob}/pause"), &json!({})).await;
    assert_eq!(paused.status(), StatusCode::OK);
    let scraped = scrape(&app).await;
    // Bob's items are ready but for the one that succeeded, if it was his (the failed one is
    // back in the queue).
    let bob_ready = 2.0 - f64::from(u8::from(claimed[0]["user"] == "bob"));
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "paused"))), bob_ready);
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "ready"))), 6.0 - bob_ready);
    assert_eq!(scraped.get("fairway_active_users", &[("service", svc)]), 1.0);

    let canceled = app.post(&format!("/jobs/{alice}/cancel"), &json!({})).await;
    assert_eq!(canceled.status(), StatusCode::OK);
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items(svc, "ready"))), 0.0);
    assert_eq!(scraped.get("fairway_oldest_ready_age_seconds", &[("service", svc)]), 0.0);
    assert_eq!(
        scraped.get("fairway_work_items_finished_total", &finished("canceled")),
        6.0 - bob_ready
    );

    // A long poll that finds nothing: a waiting worker while it waits, then an empty claim.
    let waiting = {
        let app_url = app.url("/work?service=idle&querier=pod-1&wait=3");
        let http = app.http.clone();
        tokio::spawn(async move { http.get(app_url).send().await.expect("long poll").status() })
    };
    app.await_waiting_workers("idle", 1).await;
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_waiting_workers", &[("service", "idle")]), 1.0);
    assert_eq!(waiting.await.expect("long poll"), StatusCode::NO_CONTENT);
    let scraped = scrape(&app).await;
    assert_eq!(
        scraped.get("fairway_claims_total", &[("service", "idle"), ("outcome", "empty")]),
        1.0
    );
    assert_eq!(scraped.get("fairway_waiting_workers", &[("service", "idle")]), 0.0);
    assert!(scraped.get("fairway_db_pool_connections", &[("state", "idle")]) >= 1.0);

    // No label names a user, a job or an item; no label is a tenant without the flag.
    let ids: Vec<String> = claimed.iter().map(|item| item["id"].to_string()).collect();
    for sample in &scraped.0 {
        assert!(!sample.labels.contains_key("tenant"), "{sample:?}");
        // `le`, a histogram bucket's bound, is a number that may equal an item id.
        for (_, value) in sample.labels.iter().filter(|(name, _)| *name != "le") {
            let forbidden = ["alice", "bob"].contains(&value.as_str())
                || *value == alice.to_string()
                || *value == bob.to_string()
                || ids.contains(value);
            assert!(!forbidden, "a label names a user, job or item: {sample:?}");
        }
    }
    // Prometheus naming: the prefix, and counters end in _total.
    for sample in &scraped.0 {
        assert!(sample.name.starts_with("fairway_"), "{sample:?}");
        if sample.kind == "counter" {
            assert!(sample.name.ends_with("_total"), "{sample:?}");
        }
    }
}

#[tokio::test]
async fn an_expired_lease_is_counted() {
    let mut args = ServeArgs::for_tests();
    args.lease = Duration::from_millis(200);
    args.reap_interval = Duration::from_millis(100);
    let app = spawn_app_with(args).await;
    app.submit_simple("carol", "leased", 1, true).await;
    assert!(app.claim("leased").await.is_some());
    scrape_until(&app, "the lease expiration", |scraped| {
        scraped.value("fairway_lease_expirations_total", &[("service", "leased")]) == Some(1.0)
            && scraped.value(
                "fairway_work_items_finished_total",
                &[("service", "leased"), ("status", "retried")],
            ) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn the_tenant_label_is_the_operators_choice() {
    let mut args = ServeArgs::for_tests();
    args.metrics.metrics_refresh = Duration::ZERO;
    args.metrics.metrics_tenant_label = true;
    let app = spawn_app_with(args).await;
    for (user, tenant, count) in [("dave", "acme", 3), ("erin", "globex", 2), ("dave", "globex", 1)]
    {
        let items: Vec<_> = (0..count).map(|n| json!({ "payload": n })).collect();
        app.submit(json!({
            "user": user, "tenant": tenant, "steps": [{ "service": "split" }], "items": items,
        }))
        .await;
    }
    let scraped = scrape(&app).await;
    let ready = |tenant| [("service", "split"), ("tenant", tenant), ("state", "ready")];
    assert_eq!(scraped.get("fairway_work_items", &ready("acme")), 3.0);
    assert_eq!(scraped.get("fairway_work_items", &ready("globex")), 3.0);
    let users = |tenant| [("service", "split"), ("tenant", tenant)];
    assert_eq!(scraped.get("fairway_active_users", &users("acme")), 1.0);
    assert_eq!(scraped.get("fairway_active_users", &users("globex")), 2.0);
}

/// However many brokers are scraped, the database computes the queue gauges at most once per
/// --metrics-refresh: a second broker reads the snapshot the first one took.
#[tokio::test]
async fn brokers_share_one_snapshot_per_refresh() {
    let mut args = ServeArgs::for_tests();
    args.metrics.metrics_refresh = Duration::from_secs(3600);
    let first = spawn_app_with(args.clone()).await;
    let scraped = scrape(&first).await;
    assert_eq!(scraped.value("fairway_work_items", &pairs(&items("shared", "ready"))), None);
    let taken = taken_at(&first).await;

    first.submit_simple("frank", "shared", 4, true).await;
    let second = spawn_broker(args.clone(), first.config.clone()).await;
    let scraped = scrape(&second).await;
    assert_eq!(
        scraped.value("fairway_work_items", &pairs(&items("shared", "ready"))),
        None,
        "the second broker computed the gauges again rather than read the first one's"
    );
    assert_eq!(taken_at(&second).await, taken);

    // Once the snapshot is old enough, the next broker to ask takes it again.
    first.db.execute("UPDATE metrics_snapshot SET taken_at = '-infinity'", &[]).await.expect("age");
    let third = spawn_broker(args, first.config.clone()).await;
    let scraped = scrape(&third).await;
    assert_eq!(scraped.get("fairway_work_items", &pairs(&items("shared", "ready"))), 4.0);
    assert_ne!(taken_at(&third).await, taken);
}

async fn taken_at(app: &TestApp) -> String {
    let row = app.db.query_one("SELECT taken_at::text FROM metrics_snapshot", &[]).await;
    row.expect("snapshot").get(0)
}

/// When a worker last asked for a service's work, shared by every broker: one that a worker
/// asked shows it at once, another once it is written (every few seconds), in the services
/// overview and in /metrics; a service no worker asked for says so.
#[tokio::test]
async fn every_broker_shows_when_a_worker_last_asked_for_each_service() {
    let mut args = ServeArgs::for_tests();
    args.metrics.metrics_refresh = Duration::from_millis(200);
    let asked = spawn_app_with(args.clone()).await;
    let other = spawn_broker(args, asked.config.clone()).await;
    asked.submit_simple("alice", "render", 2, true).await;
    asked.submit_simple("alice", "nobody-serves", 1, true).await;
    let last_asked = |services: &serde_json::Value, service: &str| {
        let services = services["services"].as_array().cloned().unwrap_or_default();
        let found = services.into_iter().find(|summary| summary["service"] == service);
        found.map(|summary| summary["last_asked"].clone()).unwrap_or_default()
    };
    let before = chrono::Utc::now();
    asked.claim("render").await.expect("an item");

    let here: serde_json::Value = asked.get("/admin/services").await.json().await.expect("JSON");
    let at = last_asked(&here, "render");
    let at: chrono::DateTime<chrono::Utc> = serde_json::from_value(at).expect("a time");
    assert!(at >= before - chrono::Duration::seconds(1), "{here}");
    assert!(last_asked(&here, "nobody-serves").is_null(), "{here}");

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let there: serde_json::Value =
            other.get("/admin/services").await.json().await.expect("JSON");
        if !last_asked(&there, "render").is_null() {
            assert!(last_asked(&there, "nobody-serves").is_null(), "{there}");
            break;
        }
        assert!(Instant::now() < deadline, "the other broker never saw the ask: {there}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let scraped = scrape(&other).await;
    let seconds =
        scraped.get("fairway_service_last_asked_timestamp_seconds", &[("service", "render")]);
    assert!(seconds >= before.timestamp() as f64 - 1.0, "{seconds}");
    let nobody = [("service", "nobody-serves")];
    assert_eq!(scraped.value("fairway_service_last_asked_timestamp_seconds", &nobody), None);
}

/// A service whose workers wait while nothing is queued is in the overview all the same, with
/// its waiting workers and when they asked.
#[tokio::test]
async fn a_service_with_workers_waiting_and_nothing_queued_is_listed() {
    let app = spawn_app().await;
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let waiting = app.http.get(app.url("/work?service=idle&querier=q&wait=10")).send();
    let waiting = tokio::spawn(waiting);
    app.await_waiting_workers("idle", 1).await;
    let services: serde_json::Value = app.get("/admin/services").await.json().await.expect("JSON");
    let listed = services["services"].as_array().cloned().unwrap_or_default();
    let idle = listed.iter().find(|summary| summary["service"] == "idle").expect("listed");
    assert_eq!(
        (&idle["ready"], &idle["running"], &idle["waiting_workers"]),
        (&json!(0), &json!(0), &json!(1))
    );
    let asked: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(idle["last_asked"].clone()).expect("a time");
    assert!(asked >= before, "{idle}");
    waiting.abort();
}

#[tokio::test]
async fn held_back_keys_count_the_users_and_tenants_claims_pass_over() {
    let mut args = ServeArgs::for_tests();
    args.metrics.metrics_refresh = Duration::ZERO;
    let app = spawn_app_with(args).await;
    let svc = "policed";
    let put = |path: String, body: serde_json::Value| {
        let request = app.request(reqwest::Method::PUT, &path).json(&body);
        async move { assert!(request.send().await.expect("PUT").status().is_success()) }
    };
    put("/admin/users/ann".into(), json!({ "max_running": 1 })).await;
    put("/admin/users/bob".into(), json!({ "rate_per_second": 0.001 })).await;
    put("/admin/tenants/acme".into(), json!({ "max_running": 1 })).await;
    for user in ["ann", "bob"] {
        app.submit_simple(user, svc, 3, true).await;
    }
    app.submit(json!({ "user": "cid", "tenant": "acme", "steps": [{ "service": svc }],
                       "items": [{}, {}] }))
        .await;
    let held = |kind: &'static str, reason: &'static str| {
        move |scraped: &Scrape| {
            scraped.value(
                "fairway_held_back_keys",
                &[("service", svc), ("kind", kind), ("reason", reason)],
            )
        }
    };
    assert_eq!(held("user", "cap")(&scrape(&app).await), None, "nobody is held back yet");
    // Each takes one item: ann reaches her cap, bob empties his bucket, acme reaches its cap.
    let claimed = app.claim_with(&format!("service={svc}&querier=pod-0&max=3")).await;
    assert_eq!(claimed.len(), 3);
    assert!(app.claim_with(&format!("service={svc}&querier=pod-0&max=3")).await.is_empty());
    let scraped = scrape(&app).await;
    assert_eq!(held("user", "cap")(&scraped), Some(1.0));
    assert_eq!(held("user", "rate")(&scraped), Some(1.0));
    assert_eq!(held("tenant", "cap")(&scraped), Some(1.0));
    assert_eq!(held("tenant", "rate")(&scraped), None);
}
