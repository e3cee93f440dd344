//! Many concurrent workers, over HTTP, against two broker processes sharing one database.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::helpers::{default_args, spawn_app, spawn_broker, TestApp};

const CLAIMERS: usize = 64;
const USERS: usize = 20;
const ITEMS_PER_USER: usize = 100;

/// Claims and completes until a claim waits a second without work; returns every item id it got.
async fn work_until_idle(app: Arc<TestApp>, worker: usize) -> Vec<i64> {
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
            ids.push(item["id"].as_i64().expect("id"));
            app.succeed(item, json!([])).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_on_two_brokers_get_each_item_exactly_once() {
    let first = spawn_app().await;
    let second = spawn_broker(default_args(), first.config.clone()).await;
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
        .map(|worker| tokio::spawn(work_until_idle(brokers[worker % 2].clone(), worker)))
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
