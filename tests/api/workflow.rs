//! Multi-step jobs: fan-out of results, aggregation, and how jobs finish.

use serde_json::{json, Value};

use crate::helpers::spawn_app;

#[tokio::test]
async fn each_result_becomes_an_item_of_the_next_step() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "split" }, { "service": "convert" }],
            "items": [{ "payload": { "granule": "g1" } }],
        }))
        .await;
    let item = app.claim("split").await.expect("step 0");
    assert_eq!(item["step"], 0);
    assert_eq!(item["inputs"], json!([]));
    app.succeed(&item, json!([{ "part": 1 }, { "part": 2 }, { "part": 3 }])).await;

    let mut inputs = Vec::new();
    while let Some(next) = app.claim("convert").await {
        assert_eq!(next["step"], 1);
        assert_eq!(
            next["payload"],
            json!({ "granule": "g1" }),
            "the parent's payload travels along"
        );
        inputs.push(next["inputs"].clone());
        app.succeed(&next, json!([])).await;
    }
    assert_eq!(inputs, [json!([{ "part": 1 }]), json!([{ "part": 2 }]), json!([{ "part": 3 }])]);
    let document = app.job(job).await;
    assert_eq!(document["status"], "successful");
    assert_eq!(document["progress"], 100);
    assert_eq!(document["steps"][1]["total"], 3);
    assert_eq!(document["steps"][1]["successful"], 3);
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_aggregating_step_waits_for_every_item_and_gets_all_results_in_order() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice",
            "is_async": false,
            "steps": [{ "service": "subsetter" }, { "service": "concat", "aggregate": true }],
            "items": [{ "payload": 1 }, { "payload": 2 }, { "payload": 3 }],
        }))
        .await;
    let first = app.claim("subsetter").await.expect("item");
    let second = app.claim("subsetter").await.expect("item");
    let third = app.claim("subsetter").await.expect("item");
    assert_eq!(app.job(job).await["status"], "running");

    // Finish out of order; results are still gathered in item-id order.
    app.succeed(&third, json!(["c"])).await;
    app.succeed(&first, json!(["a1", "a2"])).await;
    assert!(app.claim("concat").await.is_none(), "aggregation waits for the whole step");
    let document = app.job(job).await;
    assert_eq!(document["steps"][1]["total"], 0);
    assert!(document["progress"].as_u64().expect("progress") < 100);

    app.succeed(&second, json!(["b"])).await;
    let aggregate = app.claim("concat").await.expect("the aggregate item");
    assert_eq!(aggregate["step"], 1);
    assert_eq!(aggregate["inputs"], json!(["a1", "a2", "b", "c"]));
    assert!(app.claim("concat").await.is_none(), "exactly one aggregate item");
    app.succeed(&aggregate, json!(["s3://out/merged.nc", "s3://out/merged.json"])).await;

    let document = app.job(job).await;
    assert_eq!(document["status"], "successful");
    assert_eq!(document["steps"][1]["successful"], 1);
    // The job's results are the aggregate's, in the order its worker reported them.
    let results: Value = app.get(&format!("/jobs/{job}/results")).await.json().await.expect("JSON");
    assert_eq!(results["results"], json!(["s3://out/merged.nc", "s3://out/merged.json"]));
    assert_eq!(results["errors"], json!([]));
    assert_eq!(results["finished"], true);
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_aggregate_is_built_from_the_items_that_succeeded() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "a" }, { "service": "b", "aggregate": true }],
            "items": [{}, {}],
        }))
        .await;
    let ok = app.claim("a").await.expect("item");
    let bad = app.claim("a").await.expect("item");
    app.succeed(&ok, json!(["kept"])).await;
    let response = app
        .report(&bad, json!({ "status": "failed", "attempt": bad["attempt"], "error": "boom", "retryable": false }))
        .await;
    assert_eq!(response.status(), 200);
    let aggregate = app.claim("b").await.expect("aggregate after the last item of step 0 failed");
    assert_eq!(aggregate["inputs"], json!(["kept"]));
    app.succeed(&aggregate, json!([])).await;
    assert_eq!(app.job(job).await["status"], "complete_with_errors");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_job_whose_items_all_fail_has_failed() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 2, true).await;
    while let Some(item) = app.claim("svc").await {
        let body = json!({ "status": "failed", "attempt": item["attempt"], "retryable": false });
        assert_eq!(app.report(&item, body).await.status(), 200);
    }
    let document: Value = app.job(job).await;
    assert_eq!(document["status"], "failed");
    assert_eq!(document["steps"][0]["failed"], 2);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_job_reports_its_steps_and_progress() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 4, false).await;
    let document = app.job(job).await;
    assert_eq!(document["job_id"], job.to_string());
    assert_eq!(document["user"], "alice");
    assert_eq!(document["tenant"], "default");
    assert_eq!(document["actor"], json!([]));
    assert_eq!(document["is_async"], false);
    assert_eq!(document["status"], "accepted");
    assert_eq!(document["progress"], 0);
    assert_eq!(
        document["steps"],
        json!([{ "service": "svc", "aggregate": false, "components": ["unknown"], "total": 4,
                 "ready": 4, "scheduled": 0, "running": 0, "successful": 0, "failed": 0,
                 "canceled": 0 }])
    );
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!([])).await;
    let document = app.job(job).await;
    assert_eq!(document["status"], "running");
    assert_eq!(document["progress"], 25);
    app.assert_consistent().await;
}

/// A payload is handed out exactly as the database holds it. PostgreSQL prints the largest
/// double as 309 digits, which JSON parsers refuse as out of range: a broker that parsed it
/// could never hand the item out.
#[tokio::test]
async fn any_payload_postgresql_stores_is_handed_out_as_stored() {
    let app = spawn_app().await;
    let body = r#"{"user": "alice", "steps": [{"service": "svc"}],
                   "items": [{"payload": {"largest": 1.7976931348623157e308, "list": [1, "a"]}}]}"#;
    let response = app
        .http
        .post(app.url("/jobs"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 201);
    let response = app.get("/work?service=svc&querier=pod-0").await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("body");
    assert!(text.contains(r#""largest": 179769313486231570000"#), "{text}");
    assert!(text.contains(r#""list": [1, "a"]"#), "{text}");
    app.assert_consistent().await;
}
