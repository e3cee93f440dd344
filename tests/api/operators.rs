//! What operators read: who shares a service now, and the user_work table page by page.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with_auth};

#[tokio::test]
async fn admin_shares_count_each_users_running_and_ready_items_of_a_service() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 3, true).await;
    app.submit_simple("bob", "svc", 2, true).await;
    app.submit_simple("carol", "other", 1, true).await;
    // Fair order: alice, bob, then alice again.
    for _ in 0..3 {
        app.claim("svc").await.expect("an item");
    }
    let body: Value = app.get("/admin/shares?service=svc").await.json().await.expect("JSON");
    assert_eq!(
        body["users"],
        json!([
            { "user": "alice", "running": 2, "ready": 1, "weight": 1, "tier": 3,
              "max_running": 0, "rate_per_second": 0.0, "at_cap": false, "throttled": false },
            { "user": "bob", "running": 1, "ready": 1, "weight": 1, "tier": 3,
              "max_running": 0, "rate_per_second": 0.0, "at_cap": false, "throttled": false },
        ]),
        "{body}"
    );
    let body: Value =
        app.get("/admin/shares?service=svc&limit=1").await.json().await.expect("JSON");
    assert_eq!(body["users"].as_array().map(Vec::len), Some(1));
    let response = app.get("/admin/shares?service=svc&limit=0").await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn admin_user_work_pages_by_cursor_without_gaps_or_repeats() {
    let app = spawn_app().await;
    for user in ["ann", "bo", "cy", "di", "ed"] {
        app.submit_simple(user, "svc", 1, true).await;
        app.submit_simple(user, "other", 1, true).await;
    }
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page: Value = app
            .get(&format!("/admin/user-work?limit=3&after={}", urlencode(&after)))
            .await
            .json()
            .await
            .expect("JSON");
        let rows = page["rows"].as_array().expect("rows");
        seen.extend(rows.iter().map(|row| (row["user"].to_string(), row["service"].to_string())));
        match page["next_cursor"].as_str() {
            Some(cursor) => after = cursor.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10, "{seen:?}");
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), 10, "no row twice");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "in user and service order");

    let response = app.get("/admin/user-work?after=not-a-cursor").await;
    assert_eq!(response.status(), 400);
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn the_root_sends_a_newcomer_to_the_dashboard_with_or_without_auth() {
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    for app in [spawn_app().await, spawn_app_with_auth().await] {
        let response = plain.get(app.url("/")).send().await.expect("GET /");
        assert_eq!(response.status(), reqwest::StatusCode::TEMPORARY_REDIRECT);
        let location = response.headers().get(reqwest::header::LOCATION).cloned();
        assert_eq!(location.as_ref().and_then(|l| l.to_str().ok()), Some("/ui/"));
    }
}
