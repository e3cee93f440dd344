//! A worker handing an item back unworked (`"status": "released"`): ready again at once, its
//! attempt kept so that a late report of it is stale, but not counted against the budget.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::spawn_app;
use crate::metrics::scrape;

#[tokio::test]
async fn a_released_item_is_ready_at_once_and_its_attempt_does_not_count() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice", "steps": [{ "service": "handback" }], "items": [{}],
            "retry": { "max_attempts": 2, "backoff": "none" },
        }))
        .await;
    let item = app.claim("handback").await.expect("an item");
    assert_eq!(item["attempt"], 1);
    let release = json!({ "status": "released", "attempt": 1, "reason": "not now: disk full" });
    for _ in 0..2 {
        // The same release sent again gets the same answer and changes nothing.
        let answer = app.report(&item, release.clone()).await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.json::<Value>().await.expect("JSON")["status"], "ready");
    }
    let again = app.claim("handback").await.expect("the item, at once");
    assert_eq!(again["attempt"], 2);
    // The first release sent again still gets its answer, and touches attempt 2 no more than
    // another release of attempt 1 does: that one is stale.
    let repeated = app.report(&item, release).await;
    assert_eq!(repeated.status(), StatusCode::OK);
    let other = json!({ "status": "released", "attempt": 1, "reason": "another" });
    let stale = app.report(&item, other).await;
    assert_eq!(stale.status(), StatusCode::CONFLICT, "a release of a past attempt is stale");

    // Two attempts of budget: the released one did not count, so a failure now is retried.
    let failure = |attempt: i32| json!({ "status": "failed", "attempt": attempt, "error": "e" });
    let answer = app.report(&again, failure(2)).await.json::<Value>().await.expect("JSON");
    assert_eq!(answer["status"], "ready", "the release spent an attempt: {answer}");
    let last = app.claim("handback").await.expect("the item once more");
    let answer = app.report(&last, failure(3)).await.json::<Value>().await.expect("JSON");
    assert_eq!(answer["status"], "failed", "the budget's two attempts are spent: {answer}");

    let items: Value = app.get(&format!("/jobs/{job}/items")).await.json().await.expect("JSON");
    let listed = &items["items"][0];
    assert_eq!(
        (&listed["releases"], &listed["release_reason"]),
        (&json!(1), &json!("not now: disk full"))
    );
    assert_eq!(listed["error"], "e", "a release leaves the failure's error alone");
    let scraped = scrape(&app).await;
    assert_eq!(scraped.get("fairway_items_released_total", &[("service", "handback")]), 1.0);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_release_takes_a_reason_and_nothing_a_report_carries() {
    let app = spawn_app().await;
    app.submit_simple("alice", "handback", 1, true).await;
    let item = app.claim("handback").await.expect("an item");
    let before = app.fingerprint().await;
    let long = "x".repeat(1001);
    for body in [
        json!({ "status": "released", "attempt": 1, "results": [] }),
        json!({ "status": "released", "attempt": 1, "retryable": true }),
        json!({ "status": "failed", "attempt": 1, "reason": "why" }),
        json!({ "status": "released", "attempt": 1, "reason": long }),
    ] {
        let answer = app.report(&item, body.clone()).await;
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = answer.json().await.expect("JSON");
        assert_eq!(error["error"]["code"], "invalid_body", "{body}");
    }
    assert_eq!(app.fingerprint().await, before, "a refused release changes nothing");
}

/// A success may come with a warning (a Harmony service that found no data): the item keeps
/// it for the producer, and a warning with any other status is refused.
#[tokio::test]
async fn a_success_with_a_warning_keeps_it_on_the_item() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "nodata", 1, true).await;
    let item = app.claim("nodata").await.expect("an item");
    let refused = json!({ "status": "failed", "attempt": 1, "warning": "no data" });
    assert_eq!(app.report(&item, refused).await.status(), StatusCode::BAD_REQUEST);
    let success = json!({
        "status": "successful", "attempt": 1, "results": [], "warning": "no data in granule G1",
    });
    assert_eq!(app.report(&item, success.clone()).await.status(), StatusCode::OK);
    // The same report again is recognised as the same: the warning is part of it.
    assert_eq!(app.report(&item, success).await.status(), StatusCode::OK);
    let items: Value = app.get(&format!("/jobs/{job}/items")).await.json().await.expect("JSON");
    assert_eq!(items["items"][0]["warning"], "no data in granule G1", "{items}");
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}
