//! Many concurrent workers, over HTTP, against two broker processes sharing one database.

use fairway_server::config::ServeArgs;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_broker, TestApp};

const CLAIMERS: usize = 64;
const USERS: usize = 20;
const ITEMS_PER_USER: usize = 100;

/// Claims, and ends each item it got with the report `ending` makes for it, until a claim waits
/// a second without work; returns the id of every item it ended.
async fn work_until_idle(
    app: Arc<TestApp>,
    worker: usize,
    ending: fn(&Value) -> Value,
) -> Vec<i64> {
    let mut ids = Vec::new();
    loop {
        let max = 1 + worker % 3;
        let query =
            format!("service=svc&querier=pod-{}&worker={worker}&max={max}&wait=1", worker % 8);
        let items = app.claim_with(&query).await;
        if items.is_empty() {
            return ids;
        }
        for item in &items {
            let id = item["id"].as_i64().expect("id");
            let response = app.report(item, ending(item)).await;
            assert_eq!(response.status(), reqwest::StatusCode::OK, "ending item {id}");
            ids.push(id);
        }
    }
}

fn success(item: &Value) -> Value {
    json!({ "status": "successful", "attempt": item["attempt"], "results": [] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_on_two_brokers_get_each_item_exactly_once() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    let mut jobs = Vec::new();
    for user in 0..USERS {
        jobs.push(
            first
                .submit_simple(&format!("user-{user}"), "svc", ITEMS_PER_USER, user % 2 == 0)
                .await,
        );
    }
    let brokers = [Arc::new(first), Arc::new(second)];

    let handles: Vec<_> = (0..CLAIMERS)
        .map(|worker| tokio::spawn(work_until_idle(brokers[worker % 2].clone(), worker, success)))
        .collect();
    let mut handed_out = Vec::new();
    for handle in handles {
        handed_out.extend(handle.await.expect("claimer"));
    }

    let unique: HashSet<i64> = handed_out.iter().copied().collect();
    assert_eq!(unique.len(), handed_out.len(), "an item was handed out twice");
    assert_eq!(handed_out.len(), USERS * ITEMS_PER_USER, "every item handed out");
    let app = &brokers[0];
    for job in jobs {
        assert_eq!(app.job(job).await["status"], "successful");
    }
    let row = app
        .db
        .query_one(
            "SELECT count(*) FROM work_items WHERE status <> 'successful' OR attempt <> 1",
            &[],
        )
        .await
        .expect("count");
    assert_eq!(row.get::<_, i64>(0), 0, "each item claimed once and finished");
    app.assert_consistent().await;
    brokers[1].assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_user_gets_every_concurrent_worker() {
    const WORKERS: usize = 16;
    let app = Arc::new(spawn_app().await);
    app.submit_simple("alice", "svc", WORKERS, true).await;
    let handles: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let app = app.clone();
            tokio::spawn(async move {
                app.claim_with(&format!("service=svc&querier=pod-{worker}")).await
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for handle in handles {
        let items: Vec<Value> = handle.await.expect("claimer");
        assert_eq!(items.len(), 1, "no worker is turned away while alice has work");
        ids.insert(items[0]["id"].as_i64().expect("id"));
    }
    assert_eq!(ids.len(), WORKERS);
    app.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_workers_share_evenly_between_users() {
    const USERS: usize = 40;
    const ITEMS: usize = 10;
    const WORKERS: usize = 16;
    let app = Arc::new(spawn_app().await);
    for user in 0..USERS {
        app.submit_simple(&format!("user-{user:02}"), "svc", ITEMS, true).await;
    }
    // Half the backlog, so that every user has work throughout.
    let budget = Arc::new(std::sync::atomic::AtomicUsize::new(USERS * ITEMS / 2));
    let handles: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let (app, budget) = (app.clone(), budget.clone());
            tokio::spawn(async move {
                let take = || {
                    budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                        left.checked_sub(1)
                    })
                };
                while take().is_ok() {
                    let query = format!("service=svc&querier=pod-{}&worker={worker}", worker % 4);
                    let item = app.claim_with(&query).await.pop().expect("work for every user");
                    app.succeed(&item, json!([])).await;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("worker");
    }
    let rows = app
        .db
        .query(
            "SELECT j.username, count(*) FILTER (WHERE wi.status = 'successful')
               FROM work_items wi JOIN jobs j ON j.job_id = wi.job_id
              GROUP BY j.username",
            &[],
        )
        .await
        .expect("served per user");
    let served: Vec<i64> = rows.iter().map(|row| row.get(1)).collect();
    let (least, most) = (served.iter().min().copied(), served.iter().max().copied());
    assert_eq!(served.iter().sum::<i64>(), (USERS * ITEMS / 2) as i64);
    assert!(
        matches!((least, most), (Some(least), Some(most)) if most - least <= 2),
        "uneven shares between users: {served:?}"
    );
    app.assert_consistent().await;
}

/// A retryable failure on an item's first attempt, a final failure, or success with a result
/// (which a two-step job's first step fans out), by a rule of the item's id.
fn every_way(item: &Value) -> Value {
    let attempt = &item["attempt"];
    match item["id"].as_i64().unwrap_or_default() % 5 {
        0 if attempt == 1 => json!({ "status": "failed", "attempt": attempt, "retryable": true }),
        1 => json!({ "status": "failed", "attempt": attempt, "retryable": false }),
        id => json!({ "status": "successful", "attempt": attempt, "results": [{ "of": id }] }),
    }
}

/// Endings go to the database in batches that move each counter row once for the whole
/// batch. Every kind of ending at once, from 16 workers on two brokers, over jobs with actor
/// paths and with a second step their results fan out into: every counter still equals a
/// recount, and every job ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_of_every_kind_of_ending_keep_the_counters_exact() {
    const WORKERS: usize = 16;
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    let items = |count: usize| (0..count).map(|n| json!({ "payload": { "n": n } })).collect();
    let mut jobs = Vec::new();
    for user in 0..4 {
        let user = format!("user-{user}");
        let shapes = [
            (json!(["dashboard", format!("panel-{user}")]), 1, true, 30),
            (json!(["dashboard"]), 1, false, 15),
            (json!([]), 2, false, 15),
        ];
        for (actor, steps, is_async, count) in shapes {
            let steps: Vec<Value> = (0..steps).map(|_| json!({ "service": "svc" })).collect();
            let items: Vec<Value> = items(count);
            let job = json!({
                "user": user, "actor": actor, "is_async": is_async, "steps": steps, "items": items,
            });
            jobs.push(first.submit(job).await);
        }
    }
    let brokers = [Arc::new(first), Arc::new(second)];

    let handles: Vec<_> = (0..WORKERS)
        .map(|worker| tokio::spawn(work_until_idle(brokers[worker % 2].clone(), worker, every_way)))
        .collect();
    let mut ended = 0;
    for handle in handles {
        ended += handle.await.expect("worker").len();
    }

    let app = &brokers[0];
    let row = app
        .db
        .query_one(
            "SELECT count(*) FILTER (WHERE status IN ('ready', 'running')),
                    count(*) FILTER (WHERE step_index = 1),
                    count(*) + count(*) FILTER (WHERE attempt = 2)
               FROM work_items",
            &[],
        )
        .await
        .expect("counts");
    assert_eq!(row.get::<_, i64>(0), 0, "items left open");
    assert!(row.get::<_, i64>(1) > 0, "no workflow grew a second step");
    assert_eq!(row.get::<_, i64>(2) as usize, ended, "attempts ended against items' attempts");
    for job in jobs {
        let status = app.job(job).await["status"].clone();
        assert!(
            ["successful", "complete_with_errors", "failed"]
                .contains(&status.as_str().unwrap_or_default()),
            "job {job} is {status}"
        );
    }
    app.assert_consistent().await;
    brokers[1].assert_consistent().await;
}
