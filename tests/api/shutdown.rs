//! A broker process as a cluster runs it: stopped by a real SIGTERM under load, it stops handing
//! out work at once, answers everything it took on, loses no report, and exits within
//! --shutdown-timeout; its logs are JSON lines a collector can read.

use fairway_pg::Database;
use fairway_server::config::ServeArgs;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_postgres::config::Host;

use crate::helpers::{connect, empty_database, fresh_database, spawn_broker};

const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
const WORKERS: usize = 12;
const IDLE_POLLS: usize = 3;

/// A connection string for `config`, as the broker process reads DATABASE_URL.
pub(crate) fn connection_string(database: &Database) -> String {
    let config = database.config();
    let mut parts = Vec::new();
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => parts.push(format!("host={host}")),
        Some(Host::Unix(path)) => parts.push(format!("host={}", path.display())),
        None => {}
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(password)));
    }
    if let Some(dbname) = config.get_dbname() {
        parts.push(format!("dbname={dbname}"));
    }
    parts.join(" ")
}

/// A port nobody listens on now.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// `fairway serve` as a process of its own, as a cluster runs it.
async fn broker_process(config: &Database, stdout: Stdio) -> (Child, String) {
    broker_process_with(config, stdout, &[]).await
}

/// As [`broker_process`], with more environment variables (the traces test uses it too).
pub(crate) async fn broker_process_with(
    config: &Database,
    stdout: Stdio,
    env: &[(&str, &str)],
) -> (Child, String) {
    let address = format!("127.0.0.1:{}", free_port());
    broker_process_at(config, &address, stdout, env).await
}

/// As [`broker_process_with`], listening on `address`: a broker that comes back where it was.
pub(crate) async fn broker_process_at(
    config: &Database,
    address: &str,
    stdout: Stdio,
    env: &[(&str, &str)],
) -> (Child, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .envs(env.iter().copied())
        .args(["serve", "--bind", address, "--log-format", "json"])
        .arg("--shutdown-timeout")
        .arg(format!("{}s", SHUTDOWN_TIMEOUT.as_secs()))
        .env("DATABASE_URL", connection_string(config))
        .env("FAIRWAY_NO_EMBEDDED_POSTGRES", "true")
        .stdout(stdout)
        .kill_on_drop(true)
        .spawn()
        .expect("start fairway serve");
    let base = format!("http://{address}");
    await_ready(&base, Duration::from_secs(30)).await;
    (child, base)
}

/// Waits until the broker at `base` answers /readyz with 200.
pub(crate) async fn await_ready(base: &str, within: Duration) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + within;
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|response| response.status() == StatusCode::OK) {
            return;
        }
        assert!(Instant::now() < deadline, "the broker at {base} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What became of one report of a worker.
#[derive(Debug)]
enum Report {
    /// 200: applied.
    Applied,
    /// No answer (the listener had closed) or 503: the worker must send it elsewhere.
    Retry,
}

#[derive(Default)]
struct Load {
    /// Each report sent: the item, its attempt and what became of it.
    reports: Mutex<Vec<(Value, Report)>>,
    /// Claims answered with items after /readyz said 503: there must be none.
    claimed_after_drain: AtomicUsize,
    finished: AtomicUsize,
    /// Reports sent after /readyz said 503.
    reported_in_drain: AtomicUsize,
    /// Set once /readyz answered 503.
    draining: AtomicBool,
    /// Set when the test has seen what it needs: the workers stop asking for work.
    stop: AtomicBool,
}

async fn worker(base: String, slot: usize, load: Arc<Load>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let claim =
        format!("{base}/work?service=load&querier=pod-{}&worker={slot}&max=2&wait=1", slot % 4);
    while !load.stop.load(Ordering::SeqCst) {
        let sent_while_draining = load.draining.load(Ordering::SeqCst);
        let Ok(response) = http.get(&claim).send().await else { break };
        if response.status() != StatusCode::OK {
            continue;
        }
        if sent_while_draining {
            load.claimed_after_drain.fetch_add(1, Ordering::SeqCst);
        }
        let body: Value = response.json().await.expect("claim JSON");
        for item in body["work_items"].as_array().cloned().unwrap_or_default() {
            // The work takes a moment, so that some reports fall in the drain.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if load.draining.load(Ordering::SeqCst) {
                load.reported_in_drain.fetch_add(1, Ordering::SeqCst);
            }
            let report =
                json!({ "status": "successful", "attempt": item["attempt"], "results": [] });
            let url = format!("{base}/work/{}/status", item["id"]);
            let outcome = match http.post(&url).json(&report).send().await {
                Ok(answer) if answer.status() == StatusCode::OK => Report::Applied,
                Ok(answer) if answer.status() == StatusCode::SERVICE_UNAVAILABLE => Report::Retry,
                Ok(answer) => panic!("report of {item}: {}", answer.status()),
                Err(_) => Report::Retry,
            };
            if matches!(outcome, Report::Applied) {
                load.finished.fetch_add(1, Ordering::SeqCst);
            }
            load.reports.lock().expect("reports").push((item, outcome));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_a_broker_under_load() {
    let config = fresh_database().await;
    let (mut child, base) = broker_process(&config, Stdio::null()).await;
    let http = reqwest::Client::new();
    for user in 0..20 {
        let items: Vec<Value> = (0..50).map(|n| json!({ "payload": n })).collect();
        let body = json!({ "user": format!("user-{user}"), "steps": [{ "service": "load" }], "items": items });
        let response = http.post(format!("{base}/jobs")).json(&body).send().await.expect("submit");
        assert_eq!(response.status(), StatusCode::CREATED);
    }

    let load = Arc::new(Load::default());
    let workers: Vec<_> =
        (0..WORKERS).map(|slot| tokio::spawn(worker(base.clone(), slot, load.clone()))).collect();
    let idle: Vec<_> = (0..IDLE_POLLS)
        .map(|n| {
            let url = format!("{base}/work?service=idle&querier=idle-{n}&wait=30");
            let http = http.clone();
            tokio::spawn(async move {
                let answer = http.get(url).send().await.expect("long poll");
                let retry_after = answer.headers().get("retry-after").cloned();
                (answer.status(), retry_after, Instant::now())
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while load.finished.load(Ordering::SeqCst) < 200 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    let signalled = Instant::now();
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    loop {
        match http.get(format!("{base}/readyz")).send().await {
            Ok(ready) if ready.status() == StatusCode::SERVICE_UNAVAILABLE => break,
            // Already past its requests in flight, and closing.
            Err(_) => break,
            Ok(ready) => {
                let status = ready.status();
                assert!(signalled.elapsed() < Duration::from_secs(1), "/readyz still {status}");
            }
        }
    }
    load.draining.store(true, Ordering::SeqCst);
    // Waiting long polls end at once, told to go elsewhere and wait, not to ask again here.
    for poll in idle {
        let (status, retry_after, answered) = poll.await.expect("long poll");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(retry_after.is_some(), "a 503 without Retry-After");
        assert!(answered - signalled < Duration::from_secs(1), "a long poll waited on");
    }
    // Reports keep coming for the items claimed before; let them, then stop the load.
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.stop.store(true, Ordering::SeqCst);

    let exit = tokio::time::timeout(SHUTDOWN_TIMEOUT + Duration::from_secs(2), child.wait())
        .await
        .expect("the broker exits within its shutdown timeout")
        .expect("exit status");
    assert!(exit.success(), "{exit}");
    // The drain waits only for the requests in flight, not for the workers to go away.
    assert!(signalled.elapsed() < Duration::from_secs(3), "took {:?}", signalled.elapsed());
    for worker in workers {
        worker.await.expect("worker");
    }
    assert_eq!(load.claimed_after_drain.load(Ordering::SeqCst), 0, "a claim started in the drain");
    assert!(load.reported_in_drain.load(Ordering::SeqCst) > 0, "no report fell in the drain");

    // Another broker: every applied report is in the database; every other one applies there.
    let app = spawn_broker(ServeArgs::for_tests(), config).await;
    let reports = std::mem::take(&mut *load.reports.lock().expect("reports"));
    let mut retried = 0;
    for (item, report) in reports {
        let id = item["id"].as_i64().expect("id");
        if matches!(report, Report::Retry) {
            retried += 1;
            app.succeed(&item, json!([])).await;
        }
        let sql = "SELECT status::text FROM work_items WHERE id = $1";
        let row = app.db.query_one(sql, &[&id]).await.expect("item");
        assert_eq!(row.get::<_, String>(0), "successful", "item {id}");
    }
    // Every claim that committed was answered: no item is leased to a worker that never heard.
    let running = app.db.query_one("SELECT count(*) FROM work_items WHERE status = 'running'", &[]);
    assert_eq!(running.await.expect("count").get::<_, i64>(0), 0);
    app.assert_consistent().await;
    eprintln!("{retried} reports were sent again to the other broker");
}

#[tokio::test]
async fn each_request_logs_a_json_line_with_its_request_id_at_debug() {
    let config = fresh_database().await;
    // Request lines are at debug: the metrics count requests, and INFO stays readable.
    let debug = [("RUST_LOG", "info,fairway_server=debug")];
    let (child, base) = broker_process_with(&config, Stdio::piped(), &debug).await;
    let http = reqwest::Client::new();
    let given = http
        .get(format!("{base}/jobs/00000000-0000-0000-0000-000000000000"))
        .header("X-Request-Id", "trace-7")
        .send()
        .await
        .expect("GET");
    assert_eq!(given.status(), StatusCode::NOT_FOUND);
    assert_eq!(given.headers()["x-request-id"], "trace-7");
    let made = http.get(format!("{base}/healthz")).send().await.expect("GET");
    let made = made.headers()["x-request-id"].to_str().expect("ASCII").to_owned();
    assert_eq!(made.len(), 36, "a generated request id is a UUID: {made}");

    let logs = stdout_until_stopped(child).await;
    assert!(!logs.contains('\u{1b}'), "ANSI escapes in logs written to a pipe: {logs}");
    let lines = json_lines(&logs);
    let request = |id: &str| {
        lines
            .iter()
            .find(|line| line["request_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no line for {id}: {logs}"))
    };
    let line = request("trace-7");
    assert_eq!(line["route"], "/jobs/{job_id}");
    assert_eq!(line["status"], 404);
    assert!(line["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
    assert_eq!(request(&made)["route"], "/healthz");
    let message = lines
        .iter()
        .filter_map(|line| line["message"].as_str())
        .find(|message| message.starts_with("fairway is serving"))
        .expect("the serving line");
    assert!(message.contains(&format!("{base}/ui/")) && message.contains("/docs/"), "{message}");
}

/// What a broker process wrote to standard output until SIGTERM stopped it.
async fn stdout_until_stopped(child: Child) -> String {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let output = tokio::time::timeout(SHUTDOWN_TIMEOUT, child.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    String::from_utf8(output.stdout).expect("UTF-8 logs")
}

fn json_lines(logs: &str) -> Vec<Value> {
    let parse =
        |line: &str| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
    logs.lines().map(parse).collect()
}

#[tokio::test]
async fn a_healthy_start_and_stop_log_no_warning_and_each_migration_once() {
    let config = empty_database().await;
    let (first, _) = broker_process(&config, Stdio::piped()).await;
    // A second broker finds the schema made: nothing of it is news.
    let (second, _) = broker_process(&config, Stdio::piped()).await;
    let first = json_lines(&stdout_until_stopped(first).await);
    let second = json_lines(&stdout_until_stopped(second).await);
    for lines in [&first, &second] {
        let loud: Vec<&Value> = lines
            .iter()
            .filter(|line| line["level"] == "WARN" || line["level"] == "ERROR")
            .collect();
        assert!(loud.is_empty(), "a healthy start and stop warned: {loud:?}");
        let notices = lines.iter().filter(|line| line.to_string().contains("NOTICE")).count();
        assert_eq!(notices, 0, "a server notice reached the log: {lines:?}");
    }
    let mut applied: Vec<&str> = first
        .iter()
        .filter(|line| line["message"] == "applied migration")
        .filter_map(|line| line["migration"].as_str())
        .collect();
    let logged = applied.len();
    applied.dedup();
    assert!(logged > 0 && logged == applied.len(), "each migration once: {first:?}");
    assert!(second.iter().all(|line| line["message"] != "applied migration"));
}

#[tokio::test]
async fn a_pooled_connection_the_server_ends_is_logged_with_its_cause() {
    let config = fresh_database().await;
    let (broker, base) = broker_process(&config, Stdio::piped()).await;
    let http = reqwest::Client::new();
    let consistency = format!("{base}/admin/consistency");
    assert_eq!(http.get(&consistency).send().await.expect("GET").status(), StatusCode::OK);
    // Every connection of the broker's database but this one ends, as in a server restart.
    connect(&config)
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate the broker's connections");
    // The broker answers again on new connections.
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(&consistency).send().await.map(|answer| answer.status()).ok()
        != Some(StatusCode::OK)
    {
        assert!(Instant::now() < deadline, "the broker never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = json_lines(&stdout_until_stopped(broker).await);
    let ended: Vec<&Value> = lines
        .iter()
        .filter(|line| line["message"] == "a pooled database connection ended")
        .collect();
    assert!(!ended.is_empty(), "no line for the ended connections: {lines:?}");
    // Each says more than "db error"; a connection that read the server's goodbye quotes it (one
    // whose socket was reset first says so instead).
    let causes: Vec<&str> =
        ended.iter().map(|line| line["cause"].as_str().unwrap_or_default()).collect();
    assert!(causes.iter().all(|cause| cause.len() > "db error".len()), "{causes:?}");
    let server_said = "terminating connection due to administrator command";
    assert!(causes.iter().any(|cause| cause.contains(server_said)), "{causes:?}");
}

/// A preStop hook's request: /readyz answers 503 from its start, the broker goes on serving,
/// and the answer comes after --prestop-delay.
#[tokio::test]
async fn prestop_makes_the_broker_unready_and_answers_after_its_delay() {
    let mut args = ServeArgs::for_tests();
    args.prestop_delay = Duration::from_millis(700);
    let app = spawn_broker(args, fresh_database().await).await;
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    let started = Instant::now();
    let hook = tokio::spawn(app.http.get(app.url("/prestop")).send());
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.get("/readyz").await.status() != StatusCode::SERVICE_UNAVAILABLE {
        assert!(Instant::now() < deadline, "/readyz never turned 503");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Still serving: a producer's submission and a worker's claim go through.
    let job = app.submit_simple("alice", "svc", 1, true).await;
    assert!(app.claim("svc").await.is_some(), "a claim during the preStop pause");
    let answer = hook.await.expect("the hook's task").expect("an answer");
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(700), "answered before its delay");
    assert_eq!(app.get("/readyz").await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.job(job).await["status"], "running");
}
