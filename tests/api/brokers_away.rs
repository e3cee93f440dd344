//! Workers whose broker goes away: `fairway worker` keeps each finished item's report until a
//! broker takes it, and, given several brokers, carries on with the next when one stops. In
//! both, every item runs exactly once.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::helpers::fresh_database;
use crate::shutdown::{broker_process_at, broker_process_with, free_port};

/// A command that records each run of an item in `runs` (a line as it starts, another as it
/// ends), takes `seconds`, and succeeds with no results.
fn recording_command(runs: &Path, seconds: u32) -> String {
    let runs = runs.display();
    format!(
        "id=$(python3 -c 'import json, sys; print(json.load(sys.stdin)[\"id\"])'); \
         echo \"start $id\" >> {runs}; sleep {seconds}; echo \"done $id\" >> {runs}; echo '[]'"
    )
}

/// A file of its own for a test's runs, under the build's target folder.
fn runs_file(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-runs");
    std::fs::create_dir_all(&dir).expect("make target/test-runs");
    let path = dir.join(format!("{name}-{}", std::process::id()));
    std::fs::write(&path, "").expect("an empty runs file");
    path
}

/// How many lines of `runs` begin with `what` ("start" or "done").
fn count(runs: &Path, what: &str) -> usize {
    let text = std::fs::read_to_string(runs).unwrap_or_default();
    text.lines().filter(|line| line.starts_with(what)).count()
}

/// The ids each started item had, each as often as it started.
fn starts(runs: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(runs).unwrap_or_default();
    let mut ids: Vec<String> =
        text.lines().filter_map(|line| line.strip_prefix("start ")).map(str::to_owned).collect();
    ids.sort();
    ids
}

async fn await_count(runs: &Path, what: &str, at_least: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while count(runs, what) < at_least {
        assert!(Instant::now() < deadline, "{at_least} {what}s never came: {:?}", starts(runs));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn worker(urls: &str, runs: &Path, concurrency: &str, seconds: u32) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args(["worker", "--url", urls, "--service", "away", "--wait", "1s"])
        .args(["--concurrency", concurrency, "--", "sh", "-c"])
        .arg(recording_command(runs, seconds))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker")
}

async fn submit(http: &reqwest::Client, base: &str, items: usize) -> String {
    let items: Vec<Value> = (0..items).map(|n| json!({ "payload": n })).collect();
    let body = json!({ "user": "u", "steps": [{ "service": "away" }], "items": items });
    let response = http.post(format!("{base}/jobs")).json(&body).send().await.expect("submit");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("JSON");
    body["job_id"].as_str().expect("a job id").to_owned()
}

pub(crate) async fn await_successful(
    http: &reqwest::Client,
    base: &str,
    job: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let document: Value = http
            .get(format!("{base}/jobs/{job}"))
            .send()
            .await
            .expect("job")
            .json()
            .await
            .expect("JSON");
        if document["status"] == "successful" {
            return;
        }
        assert!(Instant::now() < deadline, "the job never finished: {document:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn assert_consistent(http: &reqwest::Client, base: &str) {
    let check: Value = http
        .get(format!("{base}/admin/consistency"))
        .send()
        .await
        .expect("consistency")
        .json()
        .await
        .expect("JSON");
    assert_eq!(check["consistent"], true, "{check:#}");
}

fn kill_now(child: &Child) {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("running")).expect("a pid"));
    kill(pid, Signal::SIGKILL).expect("SIGKILL");
}

/// Stops the worker with SIGTERM and answers its last line of log.
async fn last_line(worker: Child) -> String {
    let pid = Pid::from_raw(i32::try_from(worker.id().expect("running")).expect("a pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let output = tokio::time::timeout(Duration::from_secs(30), worker.wait_with_output())
        .await
        .expect("the worker exits after SIGTERM")
        .expect("its output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    text.lines().last().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn reports_wait_for_a_broker_away_fifteen_seconds_and_nothing_runs_twice() {
    let database = fresh_database().await;
    let address = format!("127.0.0.1:{}", free_port());
    let (mut broker, base) = broker_process_at(&database, &address, Stdio::null(), &[]).await;
    let http = reqwest::Client::new();
    let job = submit(&http, &base, 3).await;
    let runs = runs_file("away-fifteen-seconds");
    let worker = worker(&base, &runs, "3", 3);

    // Every slot runs a command, so no work request is in flight when the broker goes.
    await_count(&runs, "start", 3, Duration::from_secs(30)).await;
    kill_now(&broker);
    broker.wait().await.expect("the broker is gone");
    let gone = Instant::now();
    // The commands end while the broker is away: their reports wait.
    await_count(&runs, "done", 3, Duration::from_secs(10)).await;
    tokio::time::sleep_until((gone + Duration::from_secs(15)).into()).await;

    let (_broker, base) = broker_process_at(&database, &address, Stdio::null(), &[]).await;
    let back = Instant::now();
    await_successful(&http, &base, &job, Duration::from_secs(30)).await;
    let after = back.elapsed();
    assert!(
        after < Duration::from_secs(8),
        "the job finished {after:?} after the broker came back"
    );
    let started = starts(&runs);
    let mut once = started.clone();
    once.dedup();
    assert_eq!((started.len(), once.len()), (3, 3), "each item ran exactly once: {started:?}");
    assert_consistent(&http, &base).await;
    let last = last_line(worker).await;
    assert!(last.contains("stopped: every item taken was reported"), "{last}");
}

#[tokio::test]
async fn a_worker_given_two_brokers_carries_on_when_one_stops_for_good() {
    let database = fresh_database().await;
    let (first, first_base) = broker_process_with(&database, Stdio::null(), &[]).await;
    let (_second, second_base) = broker_process_with(&database, Stdio::null(), &[]).await;
    let http = reqwest::Client::new();
    let job = submit(&http, &first_base, 8).await;
    let runs = runs_file("two-brokers");
    let worker = worker(&format!("{first_base},{second_base}"), &runs, "2", 1);

    // Both slots run a command when the first broker goes: their reports, and every work
    // request after them, go to the second.
    await_count(&runs, "start", 2, Duration::from_secs(30)).await;
    kill_now(&first);
    await_successful(&http, &second_base, &job, Duration::from_secs(60)).await;
    let started = starts(&runs);
    let mut once = started.clone();
    once.dedup();
    assert_eq!((started.len(), once.len()), (8, 8), "each item ran exactly once: {started:?}");
    assert_consistent(&http, &second_base).await;
    let last = last_line(worker).await;
    assert!(last.contains("stopped: every item taken was reported"), "{last}");
}
