//! A broker on a standby in recovery, and the same broker once the standby is promoted: a
//! real streaming standby made with pg_basebackup by the project's PostgreSQL manager.

use std::time::{Duration, Instant};

use fairway_broker::db::functions;
use fairway_devdb::EmbeddedPostgres;
use fairway_pg::Database;
use fairway_server::config::ServeArgs;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{connect, spawn_broker};

/// Longest wait for the standby to replay the primary's work, and to take writes once promoted.
const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_broker_on_a_standby_is_unready_refuses_writes_with_503_and_follows_its_promotion() {
    let root = std::env::temp_dir().join(format!("fairway-failover-{}", std::process::id()));
    let primary = EmbeddedPostgres::start(Some(&root.join("primary")), None)
        .await
        .expect("start the primary")
        .ephemeral();
    primary.create_database_if_missing("fairway").await.expect("create the database");
    let primary_config =
        Database::parse(&primary.connection_string("fairway")).expect("a connection string");
    let on_primary = spawn_broker(ServeArgs::for_tests(), primary_config.clone()).await;
    let job = on_primary.submit_simple("alice", "svc", 2, true).await;
    // The primary without this build's functions, as a database only another release used
    // holds them: the broker that starts on the standby installs them once it is promoted.
    connect(&primary_config)
        .await
        .batch_execute(&format!(
            "DROP SCHEMA {0} CASCADE; DELETE FROM function_sets WHERE schema_name = '{0}'",
            functions::schema()
        ))
        .await
        .expect("drop this build's functions");

    let standby = EmbeddedPostgres::start_standby(&primary, &root.join("standby"), "test_standby")
        .await
        .expect("make and start the standby")
        .ephemeral();
    let standby_config =
        Database::parse(&standby.connection_string("fairway")).expect("a connection string");
    let db = connect(&standby_config).await;
    let in_recovery: bool =
        db.query_one("SELECT pg_is_in_recovery()", &[]).await.expect("ask").get(0);
    assert!(in_recovery, "the standby is in recovery");

    // The broker starts on it (no crash-loop), leaving the replicated schema alone.
    let on_standby = spawn_broker(ServeArgs::for_tests(), standby_config).await;
    let ready = on_standby.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = ready.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("standby in recovery"), "{message}");

    // Reads are served from the replica once it has replayed the job.
    let started = Instant::now();
    while on_standby.get(&format!("/jobs/{job}")).await.status() != StatusCode::OK {
        assert!(started.elapsed() < LIMIT, "the standby never replayed job {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A write is refused with 503 and Retry-After, not a 500: SQLSTATE 25006 is unavailability.
    let submit = on_standby
        .post(
            "/jobs",
            &json!({
                "user": "bob",
                "is_async": true,
                "steps": [{ "service": "svc" }],
                "items": [{ "payload": { "n": 0 } }],
            }),
        )
        .await;
    assert_eq!(submit.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(submit.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = submit.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    let claim = on_standby.get("/work?service=svc&querier=pod-0").await;
    assert_eq!(claim.status(), StatusCode::SERVICE_UNAVAILABLE, "a claim writes its lease");

    // Promoted, the same server takes writes: the broker is ready without a restart.
    standby.promote().await.expect("promote the standby");
    let started = Instant::now();
    while on_standby.get("/readyz").await.status() != StatusCode::OK {
        assert!(started.elapsed() < LIMIT, "the broker never became ready on the promoted standby");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    on_standby.submit_simple("bob", "svc", 1, true).await;
    let item = on_standby.claim("svc").await.expect("the promoted database hands out work");
    on_standby.succeed(&item, json!([])).await;

    standby.stop().await.expect("stop the standby");
    primary.stop().await.expect("stop the primary");
    let _ = std::fs::remove_dir_all(&root);
}
