//! Bad input: each kind gets its 4xx with a JSON error, and changes nothing.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};

/// Asserts the response is `status` with a JSON error carrying `code`, and that the database
/// is exactly as it was.
async fn assert_refused(
    app: &TestApp,
    response: reqwest::Response,
    status: u16,
    code: &str,
    before: &str,
) {
    let context = format!("{} {}", response.url(), response.status());
    assert_eq!(response.status().as_u16(), status, "{context}");
    let body: Value = response.json().await.expect("a JSON error body");
    assert_eq!(body["error"]["code"], code, "{context}: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(app.fingerprint().await, before, "{context} changed the database");
}

fn job(overrides: Value) -> Value {
    let mut body =
        json!({ "user": "alice", "steps": [{ "service": "svc" }], "items": [{ "payload": 1 }] });
    for (key, value) in overrides.as_object().expect("object") {
        if value.is_null() {
            body.as_object_mut().expect("object").remove(key);
        } else {
            body[key] = value.clone();
        }
    }
    body
}

#[tokio::test]
async fn bad_job_submissions_are_refused() {
    let app = spawn_app().await;
    app.submit_simple("seed", "svc", 2, true).await;
    let before = app.fingerprint().await;
    let long = "x".repeat(256);
    let cases = [
        (job(json!({ "urgency": 3 })), "invalid_body"),
        (job(json!({ "tenant": "" })), "invalid_tenant"),
        (job(json!({ "tenant": long })), "invalid_tenant"),
        (job(json!({ "tenant": 7 })), "invalid_body"),
        (job(json!({ "actor": ["a", "b", "c", "d"] })), "invalid_actor"),
        (job(json!({ "actor": ["a", ""] })), "invalid_actor"),
        (job(json!({ "actor": "a" })), "invalid_body"),
        (job(json!({ "user": null })), "invalid_body"),
        (job(json!({ "user": "" })), "invalid_user"),
        (job(json!({ "user": long })), "invalid_user"),
        (job(json!({ "is_async": "yes" })), "invalid_body"),
        (job(json!({ "steps": [] })), "invalid_steps"),
        (job(json!({ "steps": [{ "service": "has space" }] })), "invalid_service"),
        (job(json!({ "steps": [{ "service": "" }] })), "invalid_service"),
        (job(json!({ "steps": [{ "service": long }] })), "invalid_service"),
        (job(json!({ "steps": [{ "service": "a", "aggregate": true }] })), "invalid_steps"),
        (job(json!({ "steps": [{ "service": "a", "extra": 1 }] })), "invalid_body"),
        (job(json!({ "items": [] })), "invalid_items"),
        (job(json!({ "items": [{ "payload": 1, "extra": "x" }] })), "invalid_body"),
        (job(json!({ "items": [{ "payload": 1, "component": "Ingester" }] })), "invalid_component"),
        (job(json!({ "items": [{ "payload": 1, "component": "" }] })), "invalid_component"),
        (job(json!({ "items": [{ "component": "x".repeat(65) }] })), "invalid_component"),
        (job(json!({ "items": null })), "invalid_body"),
        (job(json!({ "items": [{ "payload": { "a": "x\u{0}y" } }] })), "invalid_text"),
        (job(json!({ "items": [{ "payload": { "k\u{0}": 1 } }] })), "invalid_text"),
        (json!([1, 2]), "invalid_body"),
    ];
    for (body, code) in cases {
        let response = app.post("/jobs", &body).await;
        assert_refused(&app, response, 400, code, &before).await;
    }
    let malformed = app.http.post(app.url("/jobs")).body("{\"user\": ").send().await.expect("POST");
    assert_refused(&app, malformed, 400, "invalid_body", &before).await;

    let huge = json!({ "user": "alice", "steps": [{ "service": "svc" }],
                       "items": [{ "payload": "x".repeat(2 * 1024 * 1024) }] });
    let response = app.post("/jobs", &huge).await;
    assert_refused(&app, response, 413, "payload_too_large", &before).await;
    app.assert_consistent().await;
}

#[tokio::test]
async fn bad_work_requests_are_refused() {
    let app = spawn_app().await;
    app.submit_simple("seed", "svc", 2, true).await;
    let before = app.fingerprint().await;
    let cases = [
        ("querier=pod-0", "invalid_query"),
        ("service=svc", "invalid_query"),
        ("service=has%20space&querier=pod-0", "invalid_service"),
        ("service=svc&querier=", "invalid_querier"),
        ("service=svc&querier=pod-0&worker=1024", "invalid_query"),
        ("service=svc&querier=pod-0&worker=-1", "invalid_query"),
        ("service=svc&querier=pod-0&wait=61", "invalid_query"),
        ("service=svc&querier=pod-0&max=0", "invalid_query"),
        ("service=svc&querier=pod-0&max=101", "invalid_query"),
        ("service=svc&querier=pod-0&max=two", "invalid_query"),
        ("service=svc&querier=pod-0&tenant=acme", "invalid_query"),
    ];
    for (query, code) in cases {
        let response = app.get(&format!("/work?{query}")).await;
        assert_refused(&app, response, 400, code, &before).await;
    }
    app.assert_consistent().await;
}

#[tokio::test]
async fn bad_status_updates_are_refused() {
    let app = spawn_app().await;
    let job = app.submit_simple("seed", "svc", 2, true).await;
    let item = app.claim("svc").await.expect("item");
    let id = item["id"].as_i64().expect("id");
    let before = app.fingerprint().await;
    let path = format!("/work/{id}/status");
    // Appended items are checked like submitted ones.
    let response =
        app.post(&format!("/jobs/{job}/items"), &json!({ "items": [{ "component": "A" }] })).await;
    assert_refused(&app, response, 400, "invalid_component", &before).await;
    let cases = [
        (json!({ "status": "done", "attempt": 1 }), "invalid_body"),
        (json!({ "status": "successful" }), "invalid_body"),
        (json!({ "status": "successful", "attempt": "1" }), "invalid_body"),
        (json!({ "status": "successful", "attempt": 1, "results": {} }), "invalid_body"),
        (json!({ "status": "failed", "attempt": 1, "results": [] }), "invalid_body"),
        (json!({ "status": "running", "attempt": 1, "retryable": false }), "invalid_body"),
        (json!({ "status": "successful", "attempt": 1, "bogus": 1 }), "invalid_body"),
        (json!({ "status": "successful", "attempt": 1, "results": [["a\u{0}"]] }), "invalid_text"),
        (json!({ "status": "failed", "attempt": 1, "error": "bad\u{0}" }), "invalid_text"),
        (json!({ "status": "failed", "attempt": 1, "component": "b" }), "invalid_body"),
        (json!({ "status": "successful", "attempt": 1, "component": "B" }), "invalid_component"),
        (json!({ "status": "successful", "attempt": 1, "component": 7 }), "invalid_body"),
    ];
    for (body, code) in cases {
        let response = app.post(&path, &body).await;
        assert_refused(&app, response, 400, code, &before).await;
    }
    let response =
        app.post("/work/abc/status", &json!({ "status": "running", "attempt": 1 })).await;
    assert_refused(&app, response, 400, "invalid_path", &before).await;
    let response =
        app.post("/work/999999/status", &json!({ "status": "successful", "attempt": 1 })).await;
    assert_refused(&app, response, 404, "work_item_not_found", &before).await;
    let response =
        app.post("/work/999999/status", &json!({ "status": "running", "attempt": 1 })).await;
    assert_refused(&app, response, 404, "work_item_not_found", &before).await;
    let response =
        app.post(&path, &json!({ "status": "successful", "attempt": 7, "results": [] })).await;
    assert_refused(&app, response, 409, "stale_attempt", &before).await;
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_empty_body_and_a_report_on_an_unclaimed_item_say_what_is_wrong() {
    let app = spawn_app().await;
    let job = app.submit_simple("seed", "svc", 1, true).await;
    let id: i64 = app
        .db
        .query_one("SELECT id FROM work_items WHERE job_id = $1", &[&job])
        .await
        .expect("the item")
        .get(0);
    let message = |body: Value| body["error"]["message"].as_str().unwrap_or_default().to_owned();

    // As `curl -X POST localhost:8080/jobs` sends it: no body, no Content-Type.
    let response = app.http.post(app.url("/jobs")).send().await.expect("POST");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "invalid_body");
    assert!(message(body.clone()).contains("no body"), "{body}");

    for attempt in [0, 1] {
        let report = json!({ "status": "successful", "attempt": attempt, "results": [] });
        let response = app.post(&format!("/work/{id}/status"), &report).await;
        assert_eq!(response.status(), 409);
        let body: Value = response.json().await.expect("JSON");
        assert!(message(body.clone()).contains("never claimed"), "attempt {attempt}: {body}");
    }
}

#[tokio::test]
async fn unknown_and_malformed_job_ids_are_refused() {
    let app = spawn_app().await;
    app.submit_simple("seed", "svc", 1, true).await;
    let before = app.fingerprint().await;
    let unknown = uuid::Uuid::new_v4();
    let response = app.get(&format!("/jobs/{unknown}")).await;
    assert_refused(&app, response, 404, "job_not_found", &before).await;
    for action in ["pause", "resume", "cancel"] {
        let response = app.post(&format!("/jobs/{unknown}/{action}"), &json!({})).await;
        assert_refused(&app, response, 404, "job_not_found", &before).await;
        let response = app.post(&format!("/jobs/not-a-uuid/{action}"), &json!({})).await;
        assert_refused(&app, response, 400, "invalid_path", &before).await;
    }
    let response = app.post(&format!("/jobs/{unknown}/explode"), &json!({})).await;
    assert_refused(&app, response, 400, "invalid_path", &before).await;
    let response = app.get("/no/such/endpoint").await;
    assert_refused(&app, response, 404, "not_found", &before).await;
    let response = app.get(&format!("/jobs/{unknown}/cancel")).await;
    assert_refused(&app, response, 405, "method_not_allowed", &before).await;
    let response = app.post("/admin/consistency", &json!({})).await;
    assert_refused(&app, response, 405, "method_not_allowed", &before).await;
    let response = app.get("/admin/user-work?limit=0").await;
    assert_refused(&app, response, 400, "invalid_query", &before).await;
    app.assert_consistent().await;
}

#[tokio::test]
async fn bad_listing_and_waiting_parameters_are_refused_naming_the_parameter() {
    let app = spawn_app().await;
    let job = app.submit_simple("seed", "svc", 1, true).await;
    let before = app.fingerprint().await;
    let cases = [
        (format!("/jobs/{job}/results?limit=0"), "limit"),
        (format!("/jobs/{job}/results?limit=10001"), "limit"),
        (format!("/jobs/{job}/results?limit=-1"), "limit"),
        (format!("/jobs/{job}/results?limit=ten"), "limit"),
        (format!("/jobs/{job}/results?cursor=7"), "cursor"),
        (format!("/jobs/{job}/results?cursor=7.x"), "cursor"),
        (format!("/jobs/{job}/results?cursor=-1.0"), "cursor"),
        (format!("/jobs/{job}/results?page=2"), "page"),
        (format!("/jobs/{job}/items?limit=100000"), "limit"),
        (format!("/jobs/{job}/items?cursor=abc"), "cursor"),
        (format!("/jobs/{job}/items?cursor=99999999999999999999"), "cursor"),
        (format!("/jobs/{job}/items?status=done"), "status"),
        (format!("/jobs/{job}/items?status=Ready"), "status"),
        (format!("/jobs/{job}/items?step=-1"), "step"),
        (format!("/jobs/{job}/items?step=first"), "step"),
        ("/jobs?user=seed&limit=0".to_owned(), "limit"),
        ("/jobs?user=seed&status=finished".to_owned(), "status"),
        ("/jobs?user=seed&cursor=123".to_owned(), "cursor"),
        ("/jobs?user=seed&cursor=123.not-a-uuid".to_owned(), "cursor"),
        ("/jobs?user=seed&cursor=x.00000000-0000-0000-0000-000000000000".to_owned(), "cursor"),
        (
            "/jobs?user=seed&cursor=-8000000000000000000.00000000-0000-0000-0000-000000000000"
                .to_owned(),
            "cursor",
        ),
        ("/jobs?status=running".to_owned(), "user or a tenant"),
        ("/jobs?user=seed&submitted_before=yesterday".to_owned(), "submitted_before"),
        ("/jobs?user=seed&submitted_before=2026-11-25".to_owned(), "submitted_before"),
        (format!("/jobs/{job}?wait=61"), "wait"),
        (format!("/jobs/{job}?wait=-1"), "wait"),
        (format!("/jobs/{job}?wait=1.5"), "wait"),
        (format!("/jobs/{job}?wait=soon"), "wait"),
        ("/work?service=svc&querier=pod-0&max=abc".to_owned(), "max=\"abc\""),
        ("/work?service=svc&querier=pod-0&wait=-1".to_owned(), "wait=\"-1\""),
        ("/work?service=svc&querier=pod-0&wait=1.5".to_owned(), "wait=\"1.5\""),
        ("/work?worker=-1&service=svc&querier=pod-0".to_owned(), "worker=\"-1\""),
        ("/admin/user-work?limit=many".to_owned(), "limit=\"many\""),
    ];
    for (path, parameter) in cases {
        let response = app.get(&path).await;
        let status = response.status();
        let body: Value = response.json().await.expect("a JSON error body");
        assert_eq!(status, 400, "GET {path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_query", "GET {path}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(parameter), "GET {path} does not name {parameter}: {message}");
        assert_eq!(app.fingerprint().await, before, "GET {path} changed the database");
    }
    let response = app.get("/jobs?user=").await;
    assert_refused(&app, response, 400, "invalid_query", &before).await;
    let response = app.get(&format!("/jobs?user={}", "x".repeat(256))).await;
    assert_refused(&app, response, 400, "invalid_user", &before).await;
    let response = app.get(&format!("/jobs/{}/results", uuid::Uuid::new_v4())).await;
    assert_refused(&app, response, 404, "job_not_found", &before).await;
    let response = app.get("/jobs/not-a-uuid/results").await;
    assert_refused(&app, response, 400, "invalid_path", &before).await;
}

#[tokio::test]
async fn a_malformed_body_is_described_in_json_terms_not_rust_types() {
    let app = spawn_app().await;
    let body = json!({ "user": "alice", "steps": ["svc"], "items": [{}] });
    let response = app.post("/jobs", &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("JSON");
    let message = error["error"]["message"].as_str().expect("a message");
    assert!(message.contains("expected a JSON object"), "{message}");
    assert!(!message.contains("StepBody"), "{message}");
}
