//! The `fairway admin`, `fairway submit` and `fairway worker` commands, run as the built binary
//! against a live broker.

use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairway_broker::db::functions::REVISION;
use fairway_server::config::ServeArgs;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use uuid::Uuid;

use crate::helpers::{spawn_app, spawn_app_with, TestApp};

fn fairway(app: &TestApp) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fairway"));
    command.env("FAIRWAY_URL", &app.address).env_remove("FAIRWAY_TOKEN");
    command
}

async fn run(app: &TestApp, args: &[&str]) -> Output {
    fairway(app).args(args).output().await.expect("run fairway")
}

/// Runs a command that must succeed and returns its standard output.
async fn succeed(app: &TestApp, args: &[&str]) -> String {
    let output = run(app, args).await;
    assert!(
        output.status.success(),
        "fairway {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[tokio::test]
async fn admin_lists_what_the_api_serves_as_tables_and_as_json() {
    let app = spawn_app().await;
    app.submit_simple("alice", "subsetter", 3, false).await;

    let table = succeed(&app, &["admin", "users", "--service", "subsetter"]).await;
    assert!(table.contains("alice") && table.contains("subsetter"), "{table}");
    let listed: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "users"]).await).expect("JSON");
    let served: Value = app.get("/admin/user-work").await.json().await.expect("JSON");
    assert_eq!(listed, served["rows"], "--json prints the API's rows");
    assert_eq!(listed[0]["ready_count"], 3);

    succeed(&app, &["admin", "tenants", "set", "acme", "--max-queriers", "2"]).await;
    let tenant = app.get("/admin/tenants/acme").await.json::<Value>().await.expect("JSON");
    assert_eq!(tenant["max_queriers"], 2);
    let tenants = succeed(&app, &["admin", "tenants"]).await;
    assert!(tenants.contains("acme") && tenants.contains("default"), "{tenants}");

    app.claim("subsetter").await.expect("an item");
    let queriers = succeed(&app, &["admin", "queriers"]).await;
    assert!(queriers.contains("pod-0") && queriers.contains("active"), "{queriers}");

    let services: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "services"]).await).expect("JSON");
    assert_eq!(services[0]["service"], "subsetter");
    assert_eq!((&services[0]["ready"], &services[0]["running"]), (&json!(2), &json!(1)));
    let table = succeed(&app, &["admin", "services"]).await;
    assert!(table.contains("subsetter") && table.contains("claims/s"), "{table}");

    let consistency = succeed(&app, &["admin", "consistency"]).await;
    assert!(consistency.contains("consistent"), "{consistency}");

    let version: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "version"]).await).expect("JSON");
    let served: Value = app.get("/admin/version").await.json().await.expect("JSON");
    assert_eq!(version, served, "--json prints the API's document");
    let table = succeed(&app, &["admin", "version"]).await;
    let broker = table_row(&table, "broker");
    assert_eq!(broker["release"], env!("CARGO_PKG_VERSION"), "{table}");
    let database = table_row(&table, "database");
    assert_eq!(database["schema migration"], served["schema_migration"], "{table}");
    let set = table_row(&table, "function set");
    let schema = fairway_broker::db::functions::schema();
    assert_eq!(set["functions"], format!("{schema} (revision {REVISION}, triggers)"), "{table}");
}

/// The cells of the row of a `fairway admin` table whose first cell is `first`, by column name.
fn table_row<'a>(table: &'a str, first: &str) -> std::collections::BTreeMap<&'a str, &'a str> {
    let mut rows = table.lines().filter(|line| line.starts_with('│')).map(|line| {
        line.split(['│', '┆']).map(str::trim).filter(|cell| !cell.is_empty()).collect::<Vec<_>>()
    });
    let header = rows.next().unwrap_or_default();
    let row = rows.find(|row| row.first() == Some(&first)).unwrap_or_default();
    header.into_iter().zip(row).collect()
}

#[tokio::test]
async fn admin_sets_and_shows_a_services_cap_and_rate_limit() {
    let app = spawn_app().await;
    let set = ["admin", "services", "set", "render", "--max-running", "3", "--rate", "2.5"];
    let table = succeed(&app, &set).await;
    let row = table_row(&table, "render");
    assert_eq!(
        (row.get("max running"), row.get("rate /s"), row.get("burst")),
        (Some(&"3"), Some(&"2.5"), Some(&"1")),
        "{table}"
    );
    // A flag left out keeps its value.
    succeed(&app, &["admin", "services", "set", "render", "--burst", "4"]).await;
    let shown: Value = serde_json::from_str(
        &succeed(&app, &["admin", "--json", "services", "show", "render"]).await,
    )
    .expect("JSON");
    let served: Value = app.get("/admin/services/render").await.json().await.expect("JSON");
    assert_eq!(shown[0], served, "--json prints the API's document");
    assert_eq!((&served["max_running"], &served["burst"]), (&json!(3), &json!(4)));

    let refused = run(&app, &["admin", "services", "set", "render", "--burst", "0"]).await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("burst"), "{said}");
}

#[tokio::test]
async fn admin_sets_and_shows_user_and_tenant_weights_caps_and_rate_limits() {
    let app = spawn_app().await;
    let set = [
        "admin",
        "users",
        "set",
        "alice",
        "--weight",
        "3",
        "--max-running",
        "10",
        "--rate",
        "5",
        "--burst",
        "2",
    ];
    let table = succeed(&app, &set).await;
    let row = table_row(&table, "alice");
    assert_eq!(
        (row.get("weight"), row.get("max running"), row.get("rate /s"), row.get("burst")),
        (Some(&"3"), Some(&"10"), Some(&"5"), Some(&"2")),
        "{table}"
    );
    // A flag left out keeps its value; --json prints the API's document.
    succeed(&app, &["admin", "users", "set", "alice", "--max-running", "1"]).await;
    let shown: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "users", "show", "alice"]).await)
            .expect("JSON");
    let served: Value = app.get("/admin/users/alice").await.json().await.expect("JSON");
    assert_eq!(shown[0], served);
    assert_eq!((&served["weight"], &served["max_running"]), (&json!(3), &json!(1)));
    // At her cap, the table says so.
    app.submit_simple("alice", "svc", 2, true).await;
    app.claim("svc").await.expect("an item");
    let table = succeed(&app, &["admin", "users", "show", "alice"]).await;
    assert_eq!(table_row(&table, "alice").get("state"), Some(&"at cap"), "{table}");

    let set = ["admin", "tenants", "set", "acme", "--weight", "4", "--max-running", "7"];
    let table = succeed(&app, &set).await;
    let row = table_row(&table, "acme");
    assert_eq!((row.get("weight"), row.get("max running")), (Some(&"4"), Some(&"7")), "{table}");
    succeed(&app, &["admin", "tenants", "set", "acme", "--max-queriers", "2"]).await;
    let tenant: Value = app.get("/admin/tenants/acme").await.json().await.expect("JSON");
    assert_eq!((&tenant["weight"], &tenant["max_queriers"]), (&json!(4), &json!(2)));

    for refused in [
        &["admin", "users", "set", "alice", "--weight", "0"][..],
        &["admin", "tenants", "set", "acme", "--weight", "1001"][..],
    ] {
        let output = run(&app, refused).await;
        assert!(!output.status.success());
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains("weight"), "{said}");
    }
}

#[tokio::test]
async fn admin_tables_count_scheduled_items_apart_from_ready_ones() {
    let app = spawn_app().await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let job = app
        .submit(json!({ "user": "alice", "steps": [{ "service": "resizer" }],
                        "items": [{}, {}], "not_before": later }))
        .await;
    app.submit_simple("bob", "resizer", 1, true).await;

    let services = succeed(&app, &["admin", "services"]).await;
    let row = table_row(&services, "resizer");
    assert_eq!((row.get("ready"), row.get("scheduled")), (Some(&"1"), Some(&"2")), "{services}");
    let shown = succeed(&app, &["admin", "jobs", "show", &job.to_string()]).await;
    let step = table_row(&shown, "0");
    assert_eq!((step.get("ready"), step.get("scheduled")), (Some(&"0"), Some(&"2")), "{shown}");
}

#[tokio::test]
async fn admin_steers_jobs_and_says_the_apis_error_with_a_failing_exit() {
    let app = spawn_app().await;
    let job = app.submit_simple("bob", "svc", 2, true).await.to_string();

    let shown = succeed(&app, &["admin", "jobs", "show", &job]).await;
    assert!(shown.contains(&job) && shown.contains("accepted"), "{shown}");
    succeed(&app, &["admin", "jobs", "pause", &job]).await;
    assert_eq!(app.job(job.parse().expect("uuid")).await["status"], "paused");
    succeed(&app, &["admin", "jobs", "resume", &job]).await;
    let canceled: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "jobs", "cancel", &job]).await)
            .expect("JSON");
    assert_eq!(canceled["status"], "canceled");

    let unknown = Uuid::new_v4().to_string();
    let output = run(&app, &["admin", "jobs", "show", &unknown]).await;
    assert!(!output.status.success(), "an unknown job fails the command");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("job_not_found") && stderr.contains(&unknown), "{stderr}");
}

#[tokio::test]
async fn admin_retries_a_jobs_failed_items() {
    let app = spawn_app().await;
    let job = app.submit_simple("bob", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("item");
    let failure = json!({ "status": "failed", "attempt": 1, "retryable": false });
    assert_eq!(app.report(&item, failure).await.status(), 200);
    let id = job.to_string();

    let table = succeed(&app, &["admin", "jobs", "retry", &id]).await;
    assert!(table.contains("retried 1 item\n") && table.contains("running"), "{table}");
    let item = app.claim("svc").await.expect("the retried item");
    assert_eq!(item["attempt"], 2);
    let failure = json!({ "status": "failed", "attempt": 2, "retryable": false });
    assert_eq!(app.report(&item, failure).await.status(), 200);
    let retried: Value =
        serde_json::from_str(&succeed(&app, &["admin", "--json", "jobs", "retry", &id]).await)
            .expect("JSON");
    assert_eq!((&retried["retried"], &retried["status"]), (&json!(1), &json!("running")));

    let output = run(&app, &["admin", "jobs", "retry", &id]).await;
    assert!(!output.status.success(), "nothing to retry fails the command");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nothing_to_retry"), "{stderr}");
    app.assert_consistent().await;
}

#[tokio::test]
async fn admin_applies_a_bulk_action_to_the_jobs_a_filter_matches() {
    let app = spawn_app().await;
    let alice = app.submit_simple("alice", "svc", 1, true).await;
    let bob = app.submit_simple("bob", "svc", 1, true).await;
    let before = app.fingerprint().await;
    let counted =
        succeed(&app, &["admin", "jobs", "bulk", "cancel", "--service", "svc", "--dry-run"]).await;
    assert!(counted.contains("matches 2 jobs; a dry run changes none"), "{counted}");
    // One job is one job, and `FAIRWAY_TOKEN=` (set but empty) sends no token.
    let one = fairway(&app)
        .env("FAIRWAY_TOKEN", "")
        .args(["admin", "jobs", "bulk", "pause", "--user", "alice", "--dry-run"])
        .output()
        .await
        .expect("run fairway");
    let said = String::from_utf8_lossy(&one.stdout);
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    assert!(said.contains("matches 1 job;"), "{said}");
    assert_eq!(app.fingerprint().await, before, "a dry run changes nothing");
    let table = succeed(&app, &["admin", "jobs", "bulk", "pause", "--user", "alice"]).await;
    assert!(table.contains("matched 1 job, changed 1"), "{table}");
    assert_eq!(app.job(alice).await["status"], "paused");
    assert_eq!(app.job(bob).await["status"], "accepted");
    let args = ["admin", "--json", "jobs", "bulk", "cancel", "--status", "accepted"];
    let answer: Value = serde_json::from_str(&succeed(&app, &args).await).expect("JSON");
    assert_eq!(answer, json!({ "matched": 1, "changed": 1 }));
    assert_eq!(app.job(bob).await["status"], "canceled");

    let output = run(&app, &["admin", "jobs", "bulk", "resume"]).await;
    assert!(!output.status.success(), "no filter fails the command");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("empty_filter"), "{stderr}");
    assert_eq!(app.job(alice).await["status"], "paused");
    app.assert_consistent().await;
}

#[tokio::test]
async fn submit_takes_a_job_from_flags_or_from_a_file() {
    let app = spawn_app().await;
    let job = succeed(
        &app,
        &[
            "submit",
            "--user",
            "carol",
            "--service",
            "subsetter",
            "--service",
            "concat",
            "--item",
            r#"{"granule": "G1"}"#,
            "--item",
            r#"{"granule": "G2"}"#,
            "--sync",
        ],
    )
    .await;
    let document = app.job(job.trim().parse().expect("the job id alone")).await;
    assert_eq!(document["user"], "carol");
    assert_eq!(document["is_async"], false);
    assert_eq!(document["steps"][0]["total"], 2);
    assert_eq!(document["steps"][1]["service"], "concat");

    let file = std::env::temp_dir().join(format!("fairway-job-{}.json", Uuid::new_v4()));
    let body = json!({"user": "dave", "steps": [{"service": "svc"}], "items": [{"payload": 7}]});
    std::fs::write(&file, body.to_string()).expect("write the job");
    let job = succeed(&app, &["submit", "--file", file.to_str().expect("path")]).await;
    std::fs::remove_file(&file).ok();
    assert_eq!(app.job(job.trim().parse().expect("job id")).await["user"], "dave");

    let output = run(&app, &["submit", "--user", "erin", "--service", "svc", "--item", "{"]).await;
    assert!(!output.status.success(), "a bad payload is refused before anything is sent");
}

/// Waits until `condition` holds of the job, or fails after `within`.
async fn await_job(app: &TestApp, job: Uuid, within: Duration, condition: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let document = app.job(job).await;
        if condition(&document) {
            return;
        }
        assert!(Instant::now() < deadline, "the job never got there: {document:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn worker(app: &TestApp, service: &str, extra: &[&str], script: &str) -> Child {
    fairway(app)
        .args(["worker", "--service", service, "--querier", "cli-pod", "--wait", "1s"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker")
}

/// Sends SIGTERM and waits for the process to exit by itself.
async fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the worker exits after SIGTERM")
        .expect("exit status")
}

#[tokio::test]
async fn a_worker_runs_its_command_per_item_and_reports_the_results() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "echo", 6, true).await;
    // The one result is the item itself, as the command read it on standard input.
    let script = r#"printf '[%s]' "$(cat)""#;
    let mut child = worker(&app, "echo", &["--concurrency", "3"], script);
    await_job(&app, job, Duration::from_secs(30), |job| job["status"] == "successful").await;
    assert!(terminate(&mut child).await.success());

    let rows = app
        .db
        .query("SELECT results, attempt FROM work_items WHERE job_id = $1 ORDER BY id", &[&job])
        .await
        .expect("items");
    for (n, row) in rows.iter().enumerate() {
        let results: Value = row.get(0);
        assert_eq!(results[0]["payload"], json!({ "n": n }), "each item's own result");
        assert_eq!(row.get::<_, i32>(1), 1, "done at the first attempt");
    }
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_failing_command_fails_its_item_with_the_end_of_its_stderr() {
    let args = ServeArgs { max_retries: 1, ..ServeArgs::for_tests() };
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "broken", 1, true).await;
    let mut child = worker(&app, "broken", &[], "cat > /dev/null; echo 'disk full' >&2; exit 3");
    await_job(&app, job, Duration::from_secs(30), |job| job["status"] == "failed").await;
    assert!(terminate(&mut child).await.success());
    let row = app
        .db
        .query_one("SELECT error, attempt FROM work_items WHERE job_id = $1", &[&job])
        .await
        .expect("item");
    let error: String = row.get(0);
    assert!(error.contains("disk full") && error.contains("3"), "{error}");
    assert_eq!(row.get::<_, i32>(1), 2, "a retryable failure, retried once");
    app.assert_consistent().await;
}

#[tokio::test]
async fn sigterm_stops_taking_work_and_finishes_what_the_worker_holds() {
    let args = ServeArgs { lease: Duration::from_secs(2), ..ServeArgs::for_tests() };
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "slow", 2, true).await;
    // Outlives the lease: only heartbeats keep the item this worker's.
    let mut child = worker(&app, "slow", &["--heartbeat", "300ms"], "sleep 3; echo '[]'");
    await_job(&app, job, Duration::from_secs(10), |job| job["steps"][0]["running"] == 1).await;
    assert!(terminate(&mut child).await.success(), "the worker drains and exits cleanly");

    let document = app.job(job).await;
    assert_eq!(document["steps"][0]["successful"], 1, "the held item was finished: {document}");
    assert_eq!(document["steps"][0]["ready"], 1, "no more work was taken: {document}");
    let attempt: i32 = app
        .db
        .query_one(
            "SELECT attempt FROM work_items WHERE job_id = $1 AND status = 'successful'",
            &[&job],
        )
        .await
        .expect("the finished item")
        .get(0);
    assert_eq!(attempt, 1, "heartbeats kept the lease past its 2 s");
    app.assert_consistent().await;
}

#[tokio::test]
async fn the_worker_heartbeats_within_a_short_first_lease() {
    let args = ServeArgs {
        first_lease: Duration::from_secs(2),
        reap_interval: Duration::from_millis(50),
        ..ServeArgs::for_tests()
    };
    let app = spawn_app_with(args).await;
    let job = app.submit_simple("alice", "slow", 1, true).await;
    // The command outlives the first lease, and the default heartbeat (30 s) is far longer:
    // the worker's first heartbeat goes when half the lease it was given has passed.
    let mut child = worker(&app, "slow", &[], "sleep 4; echo '[]'");
    await_job(&app, job, Duration::from_secs(20), |job| job["status"] == "successful").await;
    assert!(terminate(&mut child).await.success());
    let attempt: i32 = app
        .db
        .query_one("SELECT attempt FROM work_items WHERE job_id = $1", &[&job])
        .await
        .expect("the item")
        .get(0);
    assert_eq!(attempt, 1, "the first heartbeat extended the 2 s first lease");
    app.assert_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_draws_three_users_converging_on_equal_shares() {
    let app = spawn_app().await;
    let out = std::env::temp_dir().join(format!("fairway-demo-{}.svg", Uuid::new_v4()));
    let output = run(
        &app,
        &["demo", "--duration", "9s", "--item-time", "30ms", "--out", out.to_str().expect("path")],
    )
    .await;
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{summary}{}", String::from_utf8_lossy(&output.stderr));
    let svg = std::fs::read_to_string(&out).expect("the chart");
    std::fs::remove_file(&out).ok();
    for user in ["alice", "bob", "carol"] {
        assert!(svg.contains(&format!(r#"<polyline data-user="{user}""#)), "{svg}");
    }
    // The last third: all three share the workers, none far from a third.
    let last = summary.lines().find(|line| line.trim_start().starts_with("6–")).expect(&summary);
    for part in last.split(": ").nth(1).expect(last).split(", ") {
        let share: f64 = part.split(' ').nth(1).and_then(|n| n.parse().ok()).expect(part);
        assert!((0.15..=0.55).contains(&share), "{summary}");
    }
    // The demo cancels what is left, so nothing waits for a worker afterwards.
    let recount: Value = app.get("/admin/user-work?service=demo").await.json().await.expect("JSON");
    let ready: i64 = recount["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| row["ready_count"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(ready, 0);
    app.assert_consistent().await;
}

/// Waits for a worker that should stop by itself, and returns its exit and everything it wrote.
async fn exited(child: Child) -> Output {
    tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the worker stops by itself")
        .expect("its output")
}

fn worker_logging(app: &TestApp, service: &str, querier: &str, command: &[&str]) -> Child {
    fairway(app)
        .args(["worker", "--service", service, "--querier", querier, "--wait", "1s", "--"])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker")
}

#[tokio::test]
async fn a_worker_whose_command_cannot_start_stops_instead_of_failing_the_backlog() {
    let app = spawn_app().await;
    // One attempt each: the item in hand must not spend it on a command that never ran.
    let items: Vec<Value> = (0..20).map(|n| json!({ "payload": { "n": n } })).collect();
    let job = app
        .submit(json!({
            "user": "alice", "is_async": false, "steps": [{ "service": "wtypo" }],
            "items": items, "retry": { "max_attempts": 1 },
        }))
        .await;
    let child = worker_logging(&app, "wtypo", "typo-pod", &["/nonexistent/convertt"]);
    let output = exited(child).await;
    assert!(!output.status.success(), "a worker that can do nothing says so by its exit");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.contains("cannot start /nonexistent/convertt"), "{said}");

    let document = app.job(job).await;
    assert_ne!(document["status"], "failed", "{document}");
    assert_eq!(document["steps"][0]["ready"], 20, "every item waits for a working worker");
    let attempts: i64 = app
        .db
        .query_one("SELECT sum(attempt)::bigint FROM work_items WHERE job_id = $1", &[&job])
        .await
        .expect("attempts")
        .get(0);
    assert_eq!(attempts, 1, "only the item in hand was tried");
    // It was handed back, the reason recorded for operators, its attempt not counted: it is
    // claimed and worked again however small its budget.
    let items: Value =
        app.get(&format!("/jobs/{job}/items?status=ready")).await.json().await.expect("JSON");
    let handed: Vec<&Value> = items["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|item| item["releases"] == 1)
        .collect();
    assert_eq!(handed.len(), 1, "{items}");
    let reason = handed[0]["release_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot start /nonexistent/convertt"), "{reason}");
    let item = app.claim("wtypo").await.expect("the item again");
    assert_eq!(item["attempt"], 2, "a new attempt, so that a late report of the first is stale");
    app.succeed(&item, json!([])).await;
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_command_failing_item_after_item_makes_the_worker_pause_and_log_why() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "flaky", 10, false).await;
    let script = "cat > /dev/null; echo 'disk full' >&2; exit 3";
    let mut child = worker_logging(&app, "flaky", "flaky-pod", &["sh", "-c", script]);
    let stdout = child.stdout.take().expect("the worker's log");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut log = String::new();
    let paused_at = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.expect("a log line") {
            log.push_str(&line);
            log.push('\n');
            if line.contains("in a row; pausing") {
                return Instant::now();
            }
        }
        panic!("the worker ended without pausing")
    })
    .await
    .unwrap_or_else(|_| panic!("the worker never paused:\n{log}"));
    assert!(log.contains("disk full"), "the log says why each item failed:\n{log}");
    let attempts = || async {
        let row = app
            .db
            .query_one("SELECT sum(attempt)::bigint FROM work_items WHERE job_id = $1", &[&job])
            .await
            .expect("attempts");
        row.get::<_, i64>(0)
    };
    assert_eq!(attempts().await, 3, "it paused after three failures in a row");
    let deadline = Instant::now() + Duration::from_secs(20);
    while attempts().await < 4 {
        assert!(Instant::now() < deadline, "the worker never took work again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(paused_at.elapsed() >= Duration::from_millis(1500), "it paused before the next item");
    assert!(terminate(&mut child).await.success());
}

#[tokio::test]
async fn output_that_is_not_a_json_array_is_quoted_in_the_error() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "chatty", 1, true).await;
    let mut child = worker(&app, "chatty", &[], "cat > /dev/null; echo 'converted 3 granules'");
    await_job(&app, job, Duration::from_secs(30), |job| job["status"] == "failed").await;
    assert!(terminate(&mut child).await.success());
    let error: String = app
        .db
        .query_one("SELECT error FROM work_items WHERE job_id = $1", &[&job])
        .await
        .expect("item")
        .get(0);
    assert!(error.contains("began \"converted 3 granules"), "{error}");
}

#[tokio::test]
async fn a_worker_exits_when_its_querier_was_shut_down() {
    let app = spawn_app().await;
    assert!(app.claim_with("service=svc&querier=bq").await.is_empty(), "bq joins");
    let response = app.post("/queriers/bq/shutdown", &json!({})).await;
    assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
    let output = exited(worker_logging(&app, "svc", "bq", &["cat"])).await;
    assert!(!output.status.success(), "a worker with nothing to do is not a success");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("shut querier bq down"), "{said}");
}

/// Everything `fairway serve --bind BIND` prints as it refuses to start, with `env` and no
/// DATABASE_URL but the one `env` gives.
async fn refused_serve(bind: &str, env: &[(&str, &str)]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args(["serve", "--bind", bind])
        .env_remove("DATABASE_URL")
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(20), output)
        .await
        .expect("serve gives up at once")
        .expect("run fairway serve");
    assert!(!output.status.success());
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn serve_on_a_taken_port_says_so_before_touching_the_database() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = taken.local_addr().expect("its address").to_string();
    // No database answers here: had the broker gone to it first, that is what it would report.
    let nowhere = [("DATABASE_URL", "postgres://fairway@127.0.0.1:1/fairway")];
    let said = refused_serve(&address, &nowhere).await;
    let first = said.lines().next().unwrap_or_default();
    assert!(first.contains(&format!("cannot listen on {address}")), "first line: {first}\n{said}");
    assert!(first.contains("FAIRWAY_BIND") && first.contains("--bind"), "{first}");
}

#[tokio::test]
async fn boolean_settings_read_1_yes_and_true_as_true() {
    for truthy in ["1", "yes", "true", "on"] {
        let said = refused_serve("127.0.0.1:0", &[("FAIRWAY_NO_EMBEDDED_POSTGRES", truthy)]).await;
        assert!(said.contains("DATABASE_URL is required"), "{truthy}: {said}");
    }
    let said = refused_serve("127.0.0.1:0", &[("FAIRWAY_NO_EMBEDDED_POSTGRES", "maybe")]).await;
    assert!(said.contains("FAIRWAY_NO_EMBEDDED_POSTGRES") || said.contains("maybe"), "{said}");
}

#[tokio::test]
async fn admin_json_prints_the_apis_error_and_transport_errors_say_what_to_check() {
    let app = spawn_app().await;
    let unknown = Uuid::new_v4().to_string();
    let output = run(&app, &["admin", "--json", "jobs", "show", &unknown]).await;
    assert!(!output.status.success());
    let printed: Value = serde_json::from_slice(&output.stdout).expect("the API's JSON error");
    assert_eq!(printed["error"]["code"], "job_not_found", "{printed}");

    // Nothing listens on a port just bound and closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let url = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let output = fairway(&app).args(["admin", "--url", &url, "services"]).output().await;
    let said = String::from_utf8_lossy(&output.expect("run fairway").stderr).into_owned();
    assert!(said.contains(&format!("connection refused: is a broker running at {url}?")), "{said}");

    let output = fairway(&app).args(["admin", "--url", "localhost:8080", "services"]).output();
    let said = String::from_utf8_lossy(&output.await.expect("run fairway").stderr).into_owned();
    assert!(said.contains("not an http:// or https:// URL"), "{said}");
}

#[tokio::test]
async fn submit_with_an_idempotency_key_creates_one_job_however_often_it_runs() {
    let app = spawn_app().await;
    let args = [
        "submit",
        "--user",
        "alice",
        "--service",
        "svc",
        "--item",
        "{\"n\":1}",
        "--idempotency-key",
        "nightly-2024-05-01",
    ];
    let first = succeed(&app, &args).await;
    let again = succeed(&app, &args).await;
    assert_eq!(first, again, "the same job's id both times");
    let jobs: i64 = app.db.query_one("SELECT count(*) FROM jobs", &[]).await.expect("jobs").get(0);
    assert_eq!(jobs, 1);
}

#[tokio::test]
async fn the_worker_hands_its_command_the_traceparent_of_the_items_job() {
    let app = spawn_app().await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let job = json!({"user": "alice", "steps": [{"service": "trace"}], "items": [{"payload": {}}]});
    let traced = app
        .request(reqwest::Method::POST, "/jobs")
        .header("traceparent", traceparent)
        .json(&job)
        .send()
        .await
        .expect("submit");
    let traced: Value = traced.json().await.expect("JSON");
    let traced: Uuid = traced["job_id"].as_str().and_then(|id| id.parse().ok()).expect("job id");
    let untraced = app.submit_simple("bob", "trace", 1, false).await;
    let script = r#"printf '["%s"]' "${TRACEPARENT:-none}""#;
    let mut child = worker(&app, "trace", &[], script);
    for job in [traced, untraced] {
        await_job(&app, job, Duration::from_secs(30), |job| job["status"] == "successful").await;
    }
    assert!(terminate(&mut child).await.success());

    for (job, expected) in [(traced, traceparent), (untraced, "none")] {
        let row = app
            .db
            .query_one("SELECT results FROM work_items WHERE job_id = $1", &[&job])
            .await
            .expect("the item");
        assert_eq!(row.get::<_, Value>(0), json!([expected]), "job {job}");
    }
}

/// A stand-in for a broker that answers every request 503 with `Retry-After: 1`, counting the
/// work requests it gets.
async fn unavailable_broker() -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let read = connection.read(&mut request).await.unwrap_or(0);
                if request[..read].starts_with(b"GET /work") {
                    counter.fetch_add(1, AtomicOrdering::SeqCst);
                }
                let body = r#"{"error":{"code":"shutting_down","message":"stopping"}}"#;
                let answer = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: \
                     application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = connection.write_all(answer.as_bytes()).await;
            });
        }
    });
    (address, asked)
}

#[tokio::test]
async fn a_worker_facing_a_broker_that_answers_only_503_asks_a_few_times_a_second() {
    let (address, asked) = unavailable_broker().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .env("FAIRWAY_URL", &address)
        .env_remove("FAIRWAY_TOKEN")
        .args(["worker", "--service", "svc", "--concurrency", "8", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker");
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let sent = asked.load(AtomicOrdering::SeqCst);
    assert!(terminate(&mut child).await.success());
    // Eight slots ask at once at first; after that, about one request per Retry-After.
    assert!(sent >= 3, "the worker stopped asking: {sent}");
    assert!(sent <= 8 + 5 * window.as_secs() as usize / 2, "{sent} work requests in {window:?}");
}

#[tokio::test]
async fn workers_stopped_at_random_instants_strand_no_item_and_leave_their_shards() {
    let app = spawn_app().await;
    succeed(&app, &["admin", "tenants", "set", "acme", "--max-queriers", "2"]).await;
    let items: Vec<Value> = (0..300).map(|n| json!({ "payload": { "n": n } })).collect();
    let body = json!({
        "user": "alice", "tenant": "acme", "steps": [{ "service": "work" }], "items": items,
    });
    app.submit(body).await;
    // Each item takes a moment, so that signals land while items are held and claimed.
    let script = r#"cat > /dev/null; sleep 0.05; echo '[]'"#;
    let mut workers: Vec<Child> = (0..12)
        .map(|_| {
            fairway(&app)
                .args(["worker", "--service", "work", "--concurrency", "2", "--wait", "5s"])
                .args(["--", "sh", "-c", script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start a worker")
        })
        .collect();
    // Every worker has asked for work, so is past its start-up (and its signal handlers).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let queriers: Value = app.get("/admin/queriers").await.json().await.expect("JSON");
        if queriers["queriers"].as_array().is_some_and(|queriers| queriers.len() == 12) {
            break;
        }
        assert!(Instant::now() < deadline, "the workers never all asked: {queriers}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut stopped = Vec::new();
    for (n, worker) in workers.iter_mut().enumerate() {
        // Spread over 1.2 s by a fixed, uneven step: claims, commands and reports are at
        // every stage when the signals land.
        tokio::time::sleep(Duration::from_millis(37 + (n as u64 * 53) % 91)).await;
        let pid = nix::unistd::Pid::from_raw(worker.id().expect("running") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        stopped.push(Instant::now());
    }
    for worker in &mut workers {
        let exit = tokio::time::timeout(Duration::from_secs(20), worker.wait()).await;
        assert!(exit.expect("the worker exits").expect("status").success());
    }
    let running: i64 = app
        .db
        .query_one("SELECT count(*) FROM work_items WHERE status = 'running'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(running, 0, "an item was left running by a clean stop");
    // Within 2 s of the last signal no querier is active or holds a shard.
    let deadline = stopped.last().copied().unwrap_or_else(Instant::now) + Duration::from_secs(2);
    loop {
        let queriers: Value = app.get("/admin/queriers").await.json().await.expect("JSON");
        let lingering: Vec<&Value> = queriers["queriers"]
            .as_array()
            .expect("queriers")
            .iter()
            .filter(|querier| querier["state"] == "active" || querier["in_shards"] == true)
            .collect();
        if lingering.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "queriers still serving: {lingering:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.assert_consistent().await;
}
