//! A worker that sends a status update again, because it never received the answer, gets the
//! same answer and changes nothing, whichever broker it reaches; a different update to a
//! finished attempt is still a conflict.

use fairway_server::config::ServeArgs;
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, spawn_broker, TestApp};
use crate::metrics::scrape;

/// Sends `body` as the report on `item` and returns the status code and the answer.
async fn report(app: &TestApp, item: &Value, body: &Value) -> (StatusCode, Value) {
    let response = app.report(item, body.clone()).await;
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

/// Attempt endings of `service` this broker counted, with `status`.
async fn finished(app: &TestApp, service: &str, status: &str) -> f64 {
    let labels = [("service", service), ("status", status)];
    scrape(app).await.value("fairway_work_items_finished_total", &labels).unwrap_or(0.0)
}

#[tokio::test]
async fn a_repeated_success_gets_the_same_answer_from_either_broker_and_changes_nothing() {
    let app = spawn_app().await;
    let other = spawn_broker(ServeArgs::for_tests(), app.config.clone()).await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "split" }, { "service": "work" }],
            "items": [{ "payload": "x" }],
        }))
        .await;
    let item = app.claim("split").await.expect("item");
    // Key order and spacing are the worker's: the same results however it serialises them.
    let update =
        json!({ "status": "successful", "attempt": 1, "results": [{ "a": 1, "b": 2 }, 3] });
    let (status, first) = report(&app, &item, &update).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first, json!({ "id": item["id"], "status": "successful" }));
    let before = app.fingerprint().await;

    let reordered: Value = serde_json::from_str(
        r#"{"results":[{"b":2,  "a":1},3],"attempt":1,"status":"successful"}"#,
    )
    .expect("JSON");
    for (broker, body) in [(&app, &update), (&other, &update), (&app, &reordered)] {
        let (status, again) = report(broker, &item, body).await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again, first);
    }
    assert_eq!(app.fingerprint().await, before, "the repeats changed nothing");
    assert_eq!(finished(&app, "split", "successful").await, 1.0);
    assert_eq!(finished(&other, "split", "successful").await, 0.0);

    // The job moves on to its next step, and ends; the repeat still gets its answer.
    let next = app.claim_with("service=work&querier=pod-0&max=10").await;
    assert_eq!(next.len(), 2, "one item per result, made once");
    for item in &next {
        app.succeed(item, json!([])).await;
    }
    assert_eq!(app.job(job).await["status"], "successful");
    let before = app.fingerprint().await;
    for broker in [&app, &other] {
        let (status, again) = report(broker, &item, &update).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(again, first);
        let (status, again) = report(
            broker,
            &next[0],
            &json!({ "status": "successful", "attempt": 1, "results": [] }),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(again, json!({ "id": next[0]["id"], "status": "successful" }));
    }
    assert_eq!(app.fingerprint().await, before, "the repeats changed nothing");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_different_update_to_a_finished_attempt_is_still_a_conflict() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    let update = json!({ "status": "successful", "attempt": 1, "results": [1] });
    assert_eq!(report(&app, &item, &update).await.0, StatusCode::OK);
    let before = app.fingerprint().await;
    for different in [
        json!({ "status": "successful", "attempt": 1, "results": [2] }),
        json!({ "status": "successful", "attempt": 1, "results": [1], "component": "other" }),
        json!({ "status": "successful", "attempt": 1 }),
        json!({ "status": "failed", "attempt": 1, "error": "boom" }),
        json!({ "status": "running", "attempt": 1 }),
    ] {
        let (status, answer) = report(&app, &item, &different).await;
        assert_eq!(status, StatusCode::CONFLICT, "{different}: {answer}");
        assert_eq!(answer["error"]["code"], "item_finished");
    }
    assert_eq!(app.fingerprint().await, before);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_repeated_retryable_failure_answers_ready_even_once_the_item_went_again() {
    let app = spawn_app().await;
    let other = spawn_broker(ServeArgs::for_tests(), app.config.clone()).await;
    let job = app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    let failure = json!({ "status": "failed", "attempt": 1, "error": "flaky" });
    let (status, first) = report(&app, &item, &failure).await;
    assert_eq!((status, &first["status"]), (StatusCode::OK, &json!("ready")));
    let (status, again) = report(&other, &item, &failure).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));

    // Claimed again: attempt 2 runs. The repeat of attempt 1's report still gets its answer,
    // and takes nothing from attempt 2.
    let retry = app.claim("svc").await.expect("the item again");
    assert_eq!(retry["attempt"], 2);
    let before = app.fingerprint_apart_from_tenant_hints().await;
    let (status, again) = report(&other, &item, &failure).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    let (status, refused) =
        report(&other, &item, &json!({ "status": "failed", "attempt": 1, "error": "other" })).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["error"]["code"], "stale_attempt");
    assert_eq!(app.fingerprint_apart_from_tenant_hints().await, before);
    assert_eq!(
        finished(&app, "svc", "retried").await + finished(&other, "svc", "retried").await,
        1.0
    );

    app.succeed(&retry, json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

#[tokio::test]
async fn many_identical_repeats_racing_on_two_brokers_end_the_attempt_once() {
    let mut args = ServeArgs::for_tests();
    args.batches.ending_lanes = 4;
    let app = spawn_app_with(args).await;
    let other = spawn_broker(ServeArgs::for_tests(), app.config.clone()).await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "split" }, { "service": "work" }],
            "items": [{ "payload": "x" }],
        }))
        .await;
    let item = app.claim("split").await.expect("item");
    let update = json!({ "status": "successful", "attempt": 1, "results": [1, 2, 3] });
    let reports = (0..24).map(|n| {
        let broker = if n % 2 == 0 { &app } else { &other };
        report(broker, &item, &update)
    });
    for (status, answer) in join_all(reports).await {
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer, json!({ "id": item["id"], "status": "successful" }));
    }
    let ended =
        finished(&app, "split", "successful").await + finished(&other, "split", "successful").await;
    assert_eq!(ended, 1.0, "one ending, however many reports");
    let next = app.claim_with("service=work&querier=pod-0&max=100").await;
    assert_eq!(next.len(), 3, "the next step's items, made once");
    assert_eq!(app.job(job).await["steps"][1]["total"], 3);
    app.assert_consistent().await;
}
