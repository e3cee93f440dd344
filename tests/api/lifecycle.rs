//! Pausing, resuming and canceling jobs.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::spawn_app;

#[tokio::test]
async fn a_paused_job_is_not_handed_out_until_resumed() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 3, true).await;
    let other = app.submit_simple("bob", "svc", 1, true).await;

    let paused: Value =
        app.post(&format!("/jobs/{job}/pause"), &json!({})).await.json().await.expect("JSON");
    assert_eq!(paused["status"], "paused");
    let item = app.claim("svc").await.expect("bob's item");
    assert_eq!(item["job_id"], other.to_string());
    assert!(app.claim("svc").await.is_none(), "alice's paused items stay put");
    app.assert_consistent().await;

    let resumed: Value =
        app.post(&format!("/jobs/{job}/resume"), &json!({})).await.json().await.expect("JSON");
    assert_eq!(resumed["status"], "accepted", "nothing of it ran yet");
    for _ in 0..3 {
        assert_eq!(app.claim("svc").await.expect("item")["job_id"], job.to_string());
    }
    assert_eq!(app.job(job).await["status"], "running");
    app.assert_consistent().await;
}

#[tokio::test]
async fn work_created_while_paused_waits_for_resume() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({ "user": "alice", "steps": [{ "service": "a" }, { "service": "b" }], "items": [{}] }))
        .await;
    let item = app.claim("a").await.expect("item");
    app.post(&format!("/jobs/{job}/pause"), &json!({})).await;
    app.succeed(&item, json!(["x"])).await;
    assert!(app.claim("b").await.is_none(), "the next step's item is created but paused");
    assert_eq!(app.job(job).await["steps"][1]["ready"], 1);
    app.post(&format!("/jobs/{job}/resume"), &json!({})).await;
    let next = app.claim("b").await.expect("released on resume");
    assert_eq!(next["inputs"], json!(["x"]));
    app.assert_consistent().await;
}

#[tokio::test]
async fn cancel_marks_every_unfinished_item_and_refuses_its_workers() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 3, true).await;
    let running = app.claim("svc").await.expect("item");
    let canceled: Value =
        app.post(&format!("/jobs/{job}/cancel"), &json!({})).await.json().await.expect("JSON");
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["steps"][0]["canceled"], 3);
    assert_eq!(canceled["progress"], 100);
    assert!(app.claim("svc").await.is_none());

    let response =
        app.report(&running, json!({ "status": "successful", "attempt": 1, "results": [] })).await;
    assert_eq!(response.status(), 409);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "item_finished");

    let again = app.post(&format!("/jobs/{job}/cancel"), &json!({})).await;
    assert_eq!(again.status(), 200, "cancel is idempotent");
    let pause = app.post(&format!("/jobs/{job}/pause"), &json!({})).await;
    assert_eq!(pause.status(), 409);
    let resume = app.post(&format!("/jobs/{job}/resume"), &json!({})).await;
    assert_eq!(resume.status(), 409);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_finished_job_cannot_be_canceled_or_paused() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!([])).await;
    let before = app.fingerprint().await;
    for action in ["cancel", "pause", "resume"] {
        let response = app.post(&format!("/jobs/{job}/{action}"), &json!({})).await;
        assert_eq!(response.status(), 409, "{action}");
        let error: Value = response.json().await.expect("JSON");
        assert_eq!(error["error"]["code"], "job_finished");
    }
    assert_eq!(app.fingerprint().await, before);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_producer_can_add_items_to_an_unfinished_job() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let first = app.claim("svc").await.expect("item");
    let response = app
        .post(&format!("/jobs/{job}/items"), &json!({ "items": [{ "payload": "late" }, {}] }))
        .await;
    assert_eq!(response.status(), 200);
    let document: Value = response.json().await.expect("JSON");
    assert_eq!(document["steps"][0]["total"], 3);
    assert_eq!(document["steps"][0]["ready"], 2);
    app.succeed(&first, json!([])).await;
    assert_eq!(app.job(job).await["status"], "running", "the added items keep the job open");
    let added = app.claim("svc").await.expect("an added item");
    assert_eq!(added["payload"], "late");
    app.assert_consistent().await;
}

#[tokio::test]
async fn items_cannot_be_added_to_a_finished_or_aggregated_job() {
    let app = spawn_app().await;
    let finished = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!([])).await;
    let aggregated = app
        .submit(json!({ "user": "bob", "steps": [{ "service": "a" }, { "service": "b", "aggregate": true }], "items": [{}] }))
        .await;
    let item = app.claim("a").await.expect("item");
    app.succeed(&item, json!(["r"])).await;
    let before = app.fingerprint().await;
    let cases = [
        (format!("/jobs/{finished}/items"), json!({ "items": [{}] }), 409, "job_finished"),
        (format!("/jobs/{aggregated}/items"), json!({ "items": [{}] }), 409, "aggregation_started"),
        (
            format!("/jobs/{}/items", uuid::Uuid::new_v4()),
            json!({ "items": [{}] }),
            404,
            "job_not_found",
        ),
        (format!("/jobs/{finished}/items"), json!({ "items": [] }), 400, "invalid_items"),
        (
            format!("/jobs/{aggregated}/items"),
            json!({ "items": [{ "payload": "\u{0}" }] }),
            400,
            "invalid_text",
        ),
        (
            format!("/jobs/{finished}/items"),
            json!({ "items": [{ "bogus": 1 }] }),
            400,
            "invalid_body",
        ),
    ];
    for (path, body, status, code) in cases {
        let response = app.post(&path, &body).await;
        assert_eq!(response.status().as_u16(), status, "{path} {body}");
        let error: Value = response.json().await.expect("JSON");
        assert_eq!(error["error"]["code"], code);
    }
    assert_eq!(app.fingerprint().await, before);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_lost_database_gets_503_and_the_broker_recovers() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let admin = crate::helpers::server_connection().await;
    let dbname = app.config.config().get_dbname().expect("test database name").to_owned();
    let set_connections =
        |allowed: bool| format!("ALTER DATABASE \"{dbname}\" ALLOW_CONNECTIONS {allowed}");
    admin.batch_execute(&set_connections(false)).await.expect("close the database");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&dbname],
        )
        .await
        .expect("end the broker's connections");

    for response in [
        app.get("/readyz").await,
        app.get(&format!("/jobs/{job}")).await,
        app.post(
            "/jobs",
            &json!({ "user": "bob", "steps": [{ "service": "svc" }], "items": [{}] }),
        )
        .await,
    ] {
        assert_eq!(response.status(), 503, "{}", response.url());
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "database_unavailable");
    }
    assert_eq!(app.get("/healthz").await.status(), 200, "the process itself is fine");

    admin.batch_execute(&set_connections(true)).await.expect("reopen the database");
    // A connection the database ended stays in the pool until its end is noticed, and a probe
    // that draws it fails: the pool reconnects within a few probes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.get("/readyz").await.status() != 200 {
        assert!(std::time::Instant::now() < deadline, "the pool never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.job(job).await["status"], "accepted", "nothing was lost");
    app.assert_consistent().await;
}
