//! Maintenance on one broker at a time: of three broker processes on one database, one is the
//! maintenance leader and runs the shared upkeeps; killed with SIGKILL, it hands over within
//! seconds, and the reaper and the promoter keep their cadence on the next leader.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::Child;

use crate::helpers::fresh_database;
use crate::shutdown::broker_process_with;

/// The lease the brokers give: short, so that the reaper has an item to return soon.
const LEASE: Duration = Duration::from_secs(3);
/// The reaper's and the promoter's interval.
const INTERVAL: Duration = Duration::from_secs(1);
/// How long a dead leader's upkeeps may go unrun: the survivors try for the lock every second,
/// and PostgreSQL lets it go once it sees the connection closed.
const HANDOVER: Duration = Duration::from_secs(3);

/// One sample of a broker's /metrics text, by the series' whole name with its labels.
async fn sample(http: &reqwest::Client, base: &str, series: &str) -> Option<f64> {
    let text = http.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// How many passes of `upkeep` the broker at `base` ran.
async fn passes(http: &reqwest::Client, base: &str, upkeep: &str) -> f64 {
    let series = format!("fairway_upkeep_passes_total{{upkeep=\"{upkeep}\"}}");
    sample(http, base, &series).await.unwrap_or(0.0)
}

/// Waits until exactly one of `bases` says it is the maintenance leader; returns its index.
async fn await_one_leader(http: &reqwest::Client, bases: &[&str], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let mut leaders = Vec::new();
        for (index, base) in bases.iter().enumerate() {
            if sample(http, base, "fairway_maintenance_leader").await == Some(1.0) {
                leaders.push(index);
            }
        }
        if let [leader] = leaders[..] {
            return leader;
        }
        assert!(Instant::now() < deadline, "leaders among {bases:?}: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn submit(http: &reqwest::Client, base: &str, body: Value) {
    let response = http.post(format!("{base}/jobs")).json(&body).send().await.expect("submit");
    assert_eq!(response.status(), StatusCode::CREATED);
}

/// Asks each of `bases` in turn for an item of `service` until one comes; gives up at `deadline`.
async fn claim_by(
    http: &reqwest::Client,
    bases: &[&str],
    service: &str,
    deadline: Instant,
) -> Value {
    loop {
        for base in bases {
            let url = format!("{base}/work?service={service}&querier=q&worker=0");
            let answer = http.get(url).send().await.expect("claim");
            if answer.status() == StatusCode::OK {
                let body: Value = answer.json().await.expect("JSON");
                return body["work_items"][0].clone();
            }
        }
        assert!(Instant::now() < deadline, "no item of {service} came in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_broker_maintains_and_a_killed_leader_hands_over_within_seconds() {
    let database = fresh_database().await;
    let settings = [
        ("FAIRWAY_LEASE", "3s"),
        ("FAIRWAY_REAP_INTERVAL", "1s"),
        ("FAIRWAY_PROMOTE_INTERVAL", "1s"),
        // A retry at once, rather than after the default backoff.
        ("FAIRWAY_RETRY_INITIAL", "0s"),
    ];
    let mut brokers: Vec<(Child, String)> = Vec::new();
    for _ in 0..3 {
        brokers.push(broker_process_with(&database, Stdio::null(), &settings).await);
    }
    let http = reqwest::Client::new();
    let bases: Vec<&str> = brokers.iter().map(|(_, base)| base.as_str()).collect();
    let leader = await_one_leader(&http, &bases, Duration::from_secs(10)).await;

    // Only the leader runs the shared upkeeps; every broker runs its own. Once the leader has
    // reaped twice and every broker has run its own upkeep, a follower that reaped would show.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut ready = passes(&http, bases[leader], "reaper").await >= 2.0;
        for base in &bases {
            ready &= passes(&http, base, "queue_wait_read").await >= 1.0;
        }
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the upkeeps never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (index, base) in bases.iter().enumerate().filter(|(index, _)| *index != leader) {
        assert_eq!(
            passes(&http, base, "reaper").await,
            0.0,
            "broker {index} is no leader, yet reaped"
        );
    }

    // An item leased by a follower and never reported, and a job due in a few seconds.
    let follower = (leader + 1) % 3;
    let item = json!([{ "payload": 1 }]);
    submit(
        &http,
        bases[follower],
        json!({ "user": "u", "steps": [{ "service": "reaped" }], "items": item }),
    )
    .await;
    let leased = claim_by(&http, &[bases[follower]], "reaped", Instant::now() + INTERVAL).await;
    let lease_ends = Instant::now() + LEASE;
    let due = Utc::now() + chrono::Duration::seconds(4);
    let promoted = json!({ "user": "u", "steps": [{ "service": "promoted" }], "items": item,
                           "not_before": due.to_rfc3339() });
    submit(&http, bases[follower], promoted).await;

    let (mut killed, _) = brokers.remove(leader);
    let pid = Pid::from_raw(i32::try_from(killed.id().expect("running")).expect("a pid"));
    kill(pid, Signal::SIGKILL).expect("SIGKILL the leader");
    killed.wait().await.expect("reaped the process");
    let survivors: Vec<&str> = brokers.iter().map(|(_, base)| base.as_str()).collect();
    await_one_leader(&http, &survivors, HANDOVER).await;

    // The lease ends, and the new leader's reaper gives the item back within its interval (and
    // its promoter, should the retry be scheduled, within its own).
    let deadline = lease_ends + 2 * INTERVAL + HANDOVER;
    let reclaimed = claim_by(&http, &survivors, "reaped", deadline).await;
    assert_eq!(reclaimed["id"], leased["id"]);
    assert_eq!(reclaimed["attempt"], 2, "{reclaimed}");

    // The job's time comes, and the new leader's promoter makes it ready within its interval.
    let due_at = Instant::now()
        + (due - Utc::now()).to_std().unwrap_or_default()
        + INTERVAL
        + Duration::from_millis(500);
    let item = claim_by(&http, &survivors, "promoted", due_at).await;
    assert!(Utc::now() >= due, "claimed before its time: {item}");
}
