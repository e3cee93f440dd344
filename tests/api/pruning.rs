//! Pruning: finished jobs past their retention go, with their items and counter rows, and
//! nothing else does.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fairway_server::config::{PruneArgs, ServeArgs};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, spawn_app_with, spawn_broker, TestApp};

const RETENTION: Duration = Duration::from_secs(3600);

/// Makes the job look as if its last change was two hours ago (past RETENTION).
async fn backdate(app: &TestApp, job: Uuid) {
    app.db
        .execute(
            "UPDATE jobs SET updated_at = now() - interval '2 hours' WHERE job_id = $1",
            &[&job],
        )
        .await
        .expect("backdate");
}

async fn rows_of(app: &TestApp, job: Uuid) -> i64 {
    let sql = "SELECT (SELECT count(*) FROM work_items WHERE job_id = $1)
                    + (SELECT count(*) FROM user_work WHERE job_id = $1)
                    + (SELECT count(*) FROM job_steps WHERE job_id = $1)
                    + (SELECT count(*) FROM jobs WHERE job_id = $1)";
    app.db.query_one(sql, &[&job]).await.expect("count").get(0)
}

async fn assert_pruned(app: &TestApp, job: Uuid) {
    let response = app.get(&format!("/jobs/{job}")).await;
    assert_eq!(response.status(), 404, "job {job} is still there");
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "job_not_found");
    assert_eq!(rows_of(app, job).await, 0, "job {job} left rows behind");
}

/// Finishes a one-item job of `user`, successfully.
async fn finished_job(app: &TestApp, user: &str) -> Uuid {
    let job = app.submit_simple(user, "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    app.succeed(&item, json!(["done"])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    job
}

async fn cancel(app: &TestApp, job: Uuid) {
    assert_eq!(app.post(&format!("/jobs/{job}/cancel"), &json!({})).await.status(), 200);
}

#[tokio::test]
async fn pruning_removes_exactly_the_jobs_finished_before_the_cutoff() {
    let app = spawn_app().await;
    // Past the cutoff: a successful job, one complete with errors whose owner has other work,
    // and a canceled job of more items than a pruning transaction deletes.
    let old_successful = finished_job(&app, "alice").await;
    let old_with_errors = app.submit_simple("bob", "svc", 2, true).await;
    let items = app.claim_with("service=svc&querier=pod-0&max=2").await;
    app.succeed(&items[0], json!(["r"])).await;
    let failure = json!({ "status": "failed", "attempt": 1, "error": "no", "retryable": false });
    assert_eq!(app.report(&items[1], failure).await.status(), 200);
    assert_eq!(app.job(old_with_errors).await["status"], "complete_with_errors");
    let big: Vec<Value> = (0..2_500).map(|n| json!({ "payload": n })).collect();
    let old_canceled = app
        .submit(json!({ "user": "carol", "actor": ["dash"], "steps": [{ "service": "svc" }], "items": big }))
        .await;
    app.claim_with("service=svc&querier=pod-0&max=10").await;
    cancel(&app, old_canceled).await;
    // Not past it: a job that finished just now, and unfinished jobs however old their rows.
    let recent = finished_job(&app, "alice").await;
    let running = app.submit_simple("bob", "svc", 2, false).await;
    let running_item = app.claim("svc").await.expect("item");
    let waiting = app.submit_simple("dave", "other", 3, true).await;
    let paused = app.submit_simple("erin", "other", 1, true).await;
    assert_eq!(app.post(&format!("/jobs/{paused}/pause"), &json!({})).await.status(), 200);
    for job in [old_successful, old_with_errors, old_canceled, running, waiting, paused] {
        backdate(&app, job).await;
    }
    let kept = [recent, running, waiting, paused];
    let mut before = Vec::new();
    for job in kept {
        before.push((app.job(job).await, rows_of(&app, job).await));
    }

    let pruned = app.broker.maintenance().prune_finished_jobs(RETENTION).await.expect("prune");
    let pruned_ids: BTreeSet<Uuid> = pruned.jobs.iter().map(|job| job.job_id.0).collect();
    assert_eq!(pruned_ids, BTreeSet::from([old_successful, old_with_errors, old_canceled]));
    assert_eq!(pruned.jobs.len(), 3, "each job once");
    assert_eq!(pruned.items, 1 + 2 + 2_500);
    let metrics = crate::metrics::scrape(&app).await;
    assert_eq!(metrics.get("fairway_pruned_total", &[("kind", "jobs")]), 3.0);
    assert_eq!(metrics.get("fairway_pruned_total", &[("kind", "items")]), 2_503.0);
    for job in [old_successful, old_with_errors, old_canceled] {
        assert_pruned(&app, job).await;
    }
    for (job, (document, rows)) in kept.into_iter().zip(before) {
        assert_eq!(app.job(job).await, document, "job {job} changed");
        assert_eq!(rows_of(&app, job).await, rows, "job {job} lost rows");
    }
    app.assert_consistent().await;

    // The fair order goes on: the running job finishes and its owner's next job is served.
    app.succeed(&running_item, json!([])).await;
    let item = app.claim("svc").await.expect("the running job's second item");
    app.succeed(&item, json!([])).await;
    assert_eq!(app.job(running).await["status"], "successful");
    assert!(app
        .broker
        .maintenance()
        .prune_finished_jobs(RETENTION)
        .await
        .expect("prune")
        .jobs
        .is_empty());
    app.assert_consistent().await;
}

#[tokio::test]
async fn the_pruner_runs_every_prune_interval_past_the_retention() {
    let prune = PruneArgs { retention: RETENTION, prune_interval: Duration::from_millis(100) };
    let app = spawn_app_with(ServeArgs { prune, ..ServeArgs::for_tests() }).await;
    let old = finished_job(&app, "alice").await;
    let recent = finished_job(&app, "alice").await;
    backdate(&app, old).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.get(&format!("/jobs/{old}")).await.status() != 404 {
        assert!(Instant::now() < deadline, "the pruner never pruned {old}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_pruned(&app, old).await;
    assert_eq!(app.job(recent).await["status"], "successful");
    app.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_pruning_at_once_neither_deadlock_nor_delete_a_job_twice() {
    let first = spawn_app().await;
    let second = spawn_broker(ServeArgs::for_tests(), first.config.clone()).await;
    let mut jobs = BTreeSet::new();
    for n in 0..300 {
        let job = first.submit_simple(&format!("user-{}", n % 7), "svc", 5, true).await;
        cancel(&first, job).await;
        backdate(&first, job).await;
        jobs.insert(job);
    }
    let both = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(prune_until_done(&first), prune_until_done(&second))
    })
    .await
    .expect("the pruners finished: no deadlock");
    let ((by_first, first_items), (by_second, second_items)) = both;
    assert_eq!(by_first.len() + by_second.len(), jobs.len(), "each job pruned once");
    let all: BTreeSet<Uuid> = by_first.iter().chain(&by_second).copied().collect();
    assert_eq!(all, jobs);
    assert_eq!(first_items + second_items, 5 * 300);
    first.assert_consistent().await;
}

/// Runs pruning passes on `app`'s broker until no job is left; returns the jobs it deleted and
/// how many items.
async fn prune_until_done(app: &TestApp) -> (Vec<Uuid>, i64) {
    let mut pruned = Vec::new();
    let mut items = 0;
    loop {
        let pass =
            app.broker.maintenance().prune_finished_jobs(RETENTION).await.expect("a pruning pass");
        items += pass.items;
        pruned.extend(pass.jobs.iter().map(|job| job.job_id.0));
        let left: i64 =
            app.db.query_one("SELECT count(*) FROM jobs", &[]).await.expect("count").get(0);
        if left == 0 {
            return (pruned, items);
        }
        tokio::task::yield_now().await;
    }
}
