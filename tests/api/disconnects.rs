//! A worker whose long poll vanishes (it closed its connection) holds no item: its request ends
//! when the connection does, so it claims nothing, and an item its claim took while the client
//! was leaving goes back at once, its attempt not counted, rather than wait out the lease.

use fairway_server::config::ServeArgs;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::helpers::{spawn_app_with, TestApp};

/// The bound docs/workers.md promises for an item claimed for a vanished long poll.
const BOUND: Duration = Duration::from_secs(10);

/// Starts a long poll for `svc` on a raw connection, as `querier`, and returns the connection.
async fn long_poll(app: &TestApp, svc: &str, querier: &str) -> TcpStream {
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let request = format!(
        "GET /work?service={svc}&querier={querier}&wait=30 HTTP/1.1\r\nHost: {address}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send the request");
    stream
}

async fn waiting_workers(app: &TestApp, svc: &str) -> u64 {
    let body: Value = app.get("/admin/waiting-workers").await.json().await.expect("JSON");
    body["services"][svc].as_u64().unwrap_or(0)
}

/// Another worker's long poll: the item, and how long it took to come.
async fn claim_within_bound(app: &TestApp, svc: &str) -> (Value, Duration) {
    let started = Instant::now();
    let items = app.claim_with(&format!("service={svc}&querier=pod-live&wait=10")).await;
    let item = items.into_iter().next().expect("the item came back within the bound");
    (item, started.elapsed())
}

fn args() -> fairway_server::config::ServeArgs {
    let mut args = ServeArgs::for_tests();
    // The default lease: the item must not come back by its expiry.
    args.lease = Duration::from_secs(300);
    args
}

#[tokio::test]
async fn a_long_poll_whose_client_left_claims_nothing() {
    let app = spawn_app_with(args()).await;
    let svc = "vanishing";
    let stream = long_poll(&app, svc, "pod-gone").await;
    app.await_waiting_workers(svc, 1).await;
    drop(stream);
    // Its request ended with the connection: no one waits any more.
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting_workers(&app, svc).await > 0 {
        assert!(Instant::now() < deadline, "the vanished long poll still waits");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = app.submit_simple("alice", svc, 1, true).await;
    let (item, took) = claim_within_bound(&app, svc).await;
    assert!(took < BOUND, "took {took:?}");
    assert_eq!(item["attempt"], 1, "the vanished poll took no attempt");
    app.succeed(&item, serde_json::json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

/// The client leaves while its claim's batch runs: the claim commits, but its answer has no one
/// to go to, and the item goes back at once.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn an_item_claimed_while_its_client_left_is_released_without_an_attempt() {
    use fairway_broker::faults::Point;

    let app = spawn_app_with(args()).await;
    let svc = "vanishing";
    // The querier joins first, so that the held batch is the one that claims.
    assert!(app.claim_with(&format!("service={svc}&querier=pod-gone")).await.is_empty());
    let job = app.submit_simple("alice", svc, 1, true).await;
    let hold = app.broker.faults().hold(Point::ClaimCommitted);
    let stream = long_poll(&app, svc, "pod-gone").await;
    // The claim committed: the item is leased to the vanishing worker, attempt 1.
    hold.reached().await;
    let row = app.db.query_one("SELECT status::text, attempt FROM work_items", &[]).await;
    let row = row.expect("the item");
    assert_eq!((row.get::<_, String>(0).as_str(), row.get::<_, i32>(1)), ("running", 1));
    drop(stream);
    // Time for the broker to see the connection close and drop the request.
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.release();

    let (item, took) = claim_within_bound(&app, svc).await;
    assert!(took < BOUND, "took {took:?}");
    assert_eq!(item["attempt"], 1, "the released claim did not count as an attempt");
    let scraped = crate::metrics::scrape(&app).await;
    assert_eq!(scraped.get("fairway_claims_released_total", &[("service", svc)]), 1.0);
    assert_eq!(scraped.value("fairway_work_items_finished_total", &[("service", svc)]), None);
    app.assert_consistent().await;
    app.succeed(&item, serde_json::json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

/// What no broker can see: the answer went out, and its worker vanished (the connection died as
/// the answer was written, or the worker crashed after reading it). With `--first-lease 5s`
/// and the default `--reap-interval`, the item is back within the bound, as an expired lease;
/// a worker that heartbeats keeps its item for the full lease.
#[tokio::test]
async fn with_a_first_lease_an_answer_no_worker_read_comes_back_within_the_bound() {
    let mut args = args();
    args.first_lease = Duration::from_secs(5);
    args.reap_interval = Duration::from_secs(1);
    let app = spawn_app_with(args).await;
    let svc = "vanishing";
    app.submit_simple("alice", svc, 2, true).await;
    let claimed = Instant::now();
    let items = app.claim_with(&format!("service={svc}&querier=pod-gone&max=2")).await;
    assert_eq!(items.len(), 2);
    // One worker heartbeats, and so holds its item for --lease; the other is never heard of.
    let (kept, lost) = (&items[0], &items[1]);
    let response = app.report(kept, serde_json::json!({ "status": "running", "attempt": 1 })).await;
    assert_eq!(response.status(), 200);

    let (item, _) = claim_within_bound(&app, svc).await;
    let took = claimed.elapsed();
    eprintln!("an unread answer's item came back after {took:?}");
    assert!(took < BOUND, "took {took:?}");
    assert_eq!(item["id"], lost["id"]);
    assert_eq!(item["attempt"], 2, "an expired first lease counts an attempt");
    let expired = "SELECT status::text FROM work_items WHERE id = $1";
    let kept_status = app.db.query_one(expired, &[&kept["id"].as_i64()]).await.expect("row");
    assert_eq!(kept_status.get::<_, String>(0), "running", "the heartbeat extended its lease");
    app.succeed(kept, serde_json::json!([])).await;
    app.succeed(&item, serde_json::json!([])).await;
    app.assert_consistent().await;
}
