//! What producers read back: results and errors, items and jobs by cursor, and waiting for a
//! job to finish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, TestApp};

/// The bound the issue names for a waiter's answer after the job's last completion.
const WAKE_UP_BOUND: Duration = Duration::from_millis(100);

async fn get_json(app: &TestApp, path: &str) -> Value {
    let response = app.get(path).await;
    assert_eq!(response.status(), 200, "GET {path}");
    response.json().await.expect("JSON")
}

/// Every result and error of the job, read `limit` at a time; also how many pages it took.
async fn read_all_results(
    app: &TestApp,
    job: Uuid,
    limit: usize,
) -> (Vec<Value>, Vec<Value>, usize) {
    let (mut results, mut errors, mut pages) = (Vec::new(), Vec::new(), 0);
    let mut cursor = String::new();
    loop {
        let page =
            get_json(app, &format!("/jobs/{job}/results?limit={limit}&cursor={cursor}")).await;
        pages += 1;
        assert_eq!(page["finished"], true, "{page}");
        let new_results = page["results"].as_array().expect("results").clone();
        let new_errors = page["errors"].as_array().expect("errors").clone();
        let full = page["more"].as_bool().expect("more");
        results.extend(new_results);
        errors.extend(new_errors);
        cursor = page["next_cursor"].as_str().expect("next_cursor").to_owned();
        if !full {
            return (results, errors, pages);
        }
    }
}

/// The `results` field of each item of `step` of the job, in id order, as the items listing
/// gives them.
async fn step_items(app: &TestApp, job: Uuid, step: u32) -> Vec<Value> {
    let page = get_json(app, &format!("/jobs/{job}/items?step={step}")).await;
    page["items"].as_array().expect("items").clone()
}

#[tokio::test]
async fn results_come_in_item_order_after_a_fan_out() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "split" }, { "service": "convert" }],
            "items": [{ "payload": "a" }, { "payload": "b" }],
        }))
        .await;
    let first = app.claim("split").await.expect("item");
    let second = app.claim("split").await.expect("item");
    app.succeed(&second, json!(["b1", "b2", "b3"])).await;
    app.succeed(&first, json!(["a1", "a2"])).await;
    let mut converts = Vec::new();
    while let Some(item) = app.claim("convert").await {
        converts.push(item);
    }
    assert_eq!(converts.len(), 5);
    let running = get_json(&app, &format!("/jobs/{job}/results")).await;
    assert_eq!(running["finished"], false);
    assert_eq!(running["results"], json!([]), "no step-1 item has finished yet");
    // Finish the last step's items in the reverse of their order: results still come in
    // item order, each item's own results in the order it reported them.
    for item in converts.iter().rev() {
        let input = item["inputs"][0].as_str().expect("input");
        app.succeed(item, json!([format!("{input}-x"), format!("{input}-y")])).await;
    }
    assert_eq!(app.job(job).await["status"], "successful");

    let expected: Vec<Value> = step_items(&app, job, 1)
        .await
        .iter()
        .flat_map(|item| item["results"].as_array().expect("results").clone())
        .collect();
    // The fan-out made step 1's items as step 0's reports arrived: b's first.
    let expected_order =
        ["b1", "b2", "b3", "a1", "a2"].iter().flat_map(|i| [format!("{i}-x"), format!("{i}-y")]);
    assert_eq!(expected, expected_order.map(Value::from).collect::<Vec<_>>());
    let (results, errors, pages) = read_all_results(&app, job, 1000).await;
    assert_eq!(results, expected);
    assert_eq!(errors, Vec::<Value>::new());
    assert_eq!(pages, 1);
    // Two items a page: three pages, the same results.
    let (paged, _, pages) = read_all_results(&app, job, 2).await;
    assert_eq!(paged, expected);
    assert_eq!(pages, 3);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_job_complete_with_errors_lists_what_failed() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 3, true).await;
    let items: Vec<Value> = app.claim_with("service=svc&querier=pod-0&max=3").await;
    assert_eq!(items.len(), 3);
    app.succeed(&items[0], json!(["r0"])).await;
    let failed = &items[1];
    let response = app
        .report(
            failed,
            json!({ "status": "failed", "attempt": failed["attempt"], "error": "granule not found", "retryable": false }),
        )
        .await;
    assert_eq!(response.status(), 200);
    app.succeed(&items[2], json!(["r2"])).await;
    assert_eq!(app.job(job).await["status"], "complete_with_errors");

    let page = get_json(&app, &format!("/jobs/{job}/results")).await;
    assert_eq!(page["status"], "complete_with_errors");
    assert_eq!(page["finished"], true);
    assert_eq!(page["results"], json!(["r0", "r2"]));
    assert_eq!(
        page["errors"],
        json!([{ "id": failed["id"], "step": 0, "attempt": 1, "error": "granule not found" }])
    );
    let failed_items =
        get_json(&app, &format!("/jobs/{job}/items?status=failed")).await["items"].clone();
    assert_eq!(failed_items.as_array().map(Vec::len), Some(1));
    assert_eq!(failed_items[0]["id"], failed["id"]);
    assert_eq!(failed_items[0]["error"], "granule not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_items_while_items_are_appended_neither_misses_nor_repeats_one() {
    let app = Arc::new(spawn_app().await);
    let job = app.submit_simple("alice", "svc", 5, true).await;
    let appender = {
        let app = app.clone();
        tokio::spawn(async move {
            for round in 0..30 {
                let items: Vec<Value> = (0..4).map(|n| json!({ "payload": [round, n] })).collect();
                let response =
                    app.post(&format!("/jobs/{job}/items"), &json!({ "items": items })).await;
                assert_eq!(response.status(), 200);
            }
        })
    };
    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut pages_while_appending = 0;
    loop {
        let appending = !appender.is_finished();
        let page = get_json(&app, &format!("/jobs/{job}/items?limit=3&cursor={cursor}")).await;
        let items = page["items"].as_array().expect("items");
        seen.extend(items.iter().map(|item| item["id"].as_i64().expect("id")));
        cursor = page["next_cursor"].as_str().expect("next_cursor").to_owned();
        assert_eq!(page["more"], items.len() == 3, "{page}");
        if appending {
            pages_while_appending += 1;
        } else if items.len() < 3 {
            break;
        }
    }
    appender.await.expect("appender");
    assert!(pages_while_appending > 1, "the reader paged while items were appended");
    let all: Vec<i64> = app
        .db
        .query("SELECT id FROM work_items WHERE job_id = $1 ORDER BY id", &[&job])
        .await
        .expect("items")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(all.len(), 5 + 30 * 4);
    assert_eq!(seen, all, "every item once, in id order");
}

#[tokio::test]
async fn items_are_filtered_by_step_and_status() {
    let app = spawn_app().await;
    let job = app
        .submit(json!({
            "user": "alice",
            "steps": [{ "service": "split" }, { "service": "convert" }],
            "items": [{ "payload": "a" }, { "payload": "b" }, { "payload": "c" }],
        }))
        .await;
    let item = app.claim("split").await.expect("item");
    app.succeed(&item, json!(["x", "y"])).await;
    let ids = |page: Value| -> Vec<(i64, i64, String)> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|item| {
                let status = item["status"].as_str().expect("status").to_owned();
                (item["id"].as_i64().expect("id"), item["step"].as_i64().expect("step"), status)
            })
            .collect()
    };
    let all = ids(get_json(&app, &format!("/jobs/{job}/items")).await);
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|pair| pair[0].0 < pair[1].0), "in id order: {all:?}");
    let step_one = ids(get_json(&app, &format!("/jobs/{job}/items?step=1")).await);
    assert_eq!(step_one.iter().map(|i| i.1).collect::<Vec<_>>(), [1, 1]);
    let ready_step_zero =
        ids(get_json(&app, &format!("/jobs/{job}/items?step=0&status=ready")).await);
    assert_eq!(ready_step_zero.len(), 2);
    assert!(ready_step_zero.iter().all(|i| i.1 == 0 && i.2 == "ready"));
    let successful = ids(get_json(&app, &format!("/jobs/{job}/items?status=successful")).await);
    assert_eq!(successful, [(item["id"].as_i64().expect("id"), 0, "successful".to_owned())]);
    let unknown = app.get(&format!("/jobs/{}/items", Uuid::new_v4())).await;
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn jobs_are_listed_newest_first_by_user_tenant_and_status() {
    let app = spawn_app().await;
    let mut alices = Vec::new();
    for n in 0..5 {
        let tenant = if n % 2 == 0 { "acme" } else { "default" };
        alices.push(
            app.submit(json!({ "user": "alice", "tenant": tenant, "steps": [{ "service": "svc" }], "items": [{}] }))
                .await,
        );
    }
    let bobs = app.submit(json!({ "user": "bob", "tenant": "acme", "steps": [{ "service": "svc" }], "items": [{}] })).await;
    let canceled = app.post(&format!("/jobs/{}/cancel", alices[1]), &json!({})).await;
    assert_eq!(canceled.status(), 200);

    let list = |query: &str| list_jobs(&app, query.to_owned());
    let newest_first: Vec<Uuid> = alices.iter().rev().copied().collect();
    assert_eq!(list("user=alice").await, newest_first);
    assert_eq!(list("user=alice&status=canceled").await, [alices[1]]);
    assert_eq!(
        list("user=alice&status=accepted").await,
        [alices[4], alices[3], alices[2], alices[0]]
    );
    assert_eq!(list("user=alice&tenant=acme").await, [alices[4], alices[2], alices[0]]);
    assert_eq!(list("tenant=acme").await, [bobs, alices[4], alices[2], alices[0]]);
    assert_eq!(list("user=carol").await, Vec::<Uuid>::new());
}

/// Every job `query` lists, two to a page, checking each page's `more`.
async fn list_jobs(app: &TestApp, query: String) -> Vec<Uuid> {
    let mut listed = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = get_json(app, &format!("/jobs?{query}&limit=2&cursor={cursor}")).await;
        let jobs = page["jobs"].as_array().expect("jobs");
        for job in jobs {
            assert!(job["progress"].is_u64(), "{job}");
            listed.push(job["job_id"].as_str().and_then(|id| id.parse::<Uuid>().ok()).expect("id"));
        }
        assert_eq!(page["more"], jobs.len() == 2, "{page}");
        if jobs.len() < 2 {
            return listed;
        }
        cursor = page["next_cursor"].as_str().expect("next_cursor").to_owned();
    }
}

/// The filters the dashboard's list shares with the bulk actions: a step on a service, and a
/// submission time, through every page.
#[tokio::test]
async fn jobs_are_listed_by_service_and_submission_time() {
    let app = spawn_app().await;
    let mut jobs = Vec::new();
    for n in 0..6 {
        let steps = if n % 2 == 0 {
            json!([{ "service": "subsetter" }, { "service": "concat", "aggregate": true }])
        } else {
            json!([{ "service": "reformat" }])
        };
        jobs.push(app.submit(json!({ "user": "erin", "steps": steps, "items": [{}] })).await);
    }
    let list = |query: &str| list_jobs(&app, query.to_owned());
    assert_eq!(list("user=erin&service=concat").await, [jobs[4], jobs[2], jobs[0]]);
    assert_eq!(list("tenant=default&service=reformat").await, [jobs[5], jobs[3], jobs[1]]);
    assert_eq!(list("user=erin&service=nothing").await, Vec::<Uuid>::new());

    // Strictly before the fourth job's submission: the three before it.
    let fourth = app.job(jobs[3]).await["created_at"].as_str().expect("created_at").to_owned();
    let before = format!("submitted_before={}", fourth.replace('+', "%2B"));
    assert_eq!(list(&format!("user=erin&{before}")).await, [jobs[2], jobs[1], jobs[0]]);
    assert_eq!(list(&format!("user=erin&service=reformat&{before}")).await, [jobs[1]]);
    assert_eq!(list("user=erin&submitted_before=2000-01-01T00:00:00Z").await, Vec::<Uuid>::new());

    // The bulk actions' dry run counts what the listing lists.
    for (filter, listed) in [
        (json!({ "user": "erin", "service": "concat" }), 3),
        (json!({ "user": "erin", "submitted_before": fourth }), 3),
        (json!({ "service": "reformat", "status": "accepted" }), 3),
    ] {
        let mut body = filter.clone();
        body["dry_run"] = json!(true);
        let counted: Value =
            app.post("/admin/jobs/cancel", &body).await.json().await.expect("JSON");
        assert_eq!(counted, json!({ "matched": listed, "changed": 0 }), "{filter}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_answered_within_100ms_of_the_last_completion() {
    let app = Arc::new(spawn_app().await);
    let job = app
        .submit(json!({ "user": "alice", "is_async": false, "steps": [{ "service": "svc" }], "items": [{}, {}] }))
        .await;
    let items = app.claim_with("service=svc&querier=pod-0&max=2").await;
    app.succeed(&items[0], json!(["first"])).await;
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move {
            let response = app.get(&format!("/jobs/{job}?wait=30")).await;
            let answered = Instant::now();
            (answered, response.status(), response.json::<Value>().await.expect("JSON"))
        })
    };
    // Complete only once the producer is really waiting, so that the wake-up is what's measured.
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.broker.job_waiters() == 0 {
        assert!(Instant::now() < deadline, "the producer never started waiting");
        tokio::task::yield_now().await;
    }
    app.succeed(&items[1], json!(["second"])).await;
    let completed = Instant::now();
    let (answered, status, job_document) = waiter.await.expect("waiter");
    assert_eq!(status, 200);
    assert_eq!(job_document["status"], "successful");
    assert_eq!(job_document["progress"], 100);
    let delay = answered.saturating_duration_since(completed);
    assert!(delay < WAKE_UP_BOUND, "answered {delay:?} after the last completion");
    assert_eq!(app.broker.job_waiters(), 0, "the waiter let go of its watch");
}

#[tokio::test]
async fn a_waiter_answers_after_wait_with_the_unfinished_status() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 1, false).await;
    app.claim("svc").await.expect("item");
    let started = Instant::now();
    let document = get_json(&app, &format!("/jobs/{job}?wait=1")).await;
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited the whole second");
    assert!(started.elapsed() < Duration::from_secs(5), "and not much longer");
    assert_eq!(document["status"], "running");
    // A finished job answers at once.
    let canceled = app.post(&format!("/jobs/{job}/cancel"), &json!({})).await;
    assert_eq!(canceled.status(), 200);
    let started = Instant::now();
    assert_eq!(get_json(&app, &format!("/jobs/{job}?wait=30")).await["status"], "canceled");
    assert!(started.elapsed() < Duration::from_secs(1));
    let unknown = app.get(&format!("/jobs/{}?wait=1", Uuid::new_v4())).await;
    assert_eq!(unknown.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_when_its_job_is_canceled() {
    let app = Arc::new(spawn_app().await);
    let job = app.submit_simple("alice", "svc", 1, false).await;
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { get_json(&app, &format!("/jobs/{job}?wait=30")).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.broker.job_waiters() == 0 {
        assert!(Instant::now() < deadline, "the producer never started waiting");
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    assert_eq!(app.post(&format!("/jobs/{job}/cancel"), &json!({})).await.status(), 200);
    let document = waiter.await.expect("waiter");
    assert_eq!(document["status"], "canceled");
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the cancel, not the timeout");
}
