//! `fairway bench` end to end on a small matrix: every claim path, and the wide claims, run
//! without error on a seed with several jobs per user, tenants and components, and the broker's
//! counters stay exact.
//!
//! A test binary of its own, on the API tests' harness: cargo runs test binaries one at a time,
//! so the benchmark's load (checkpoints, vacuums, busy workers) does not run beside the API
//! tests, some of which judge how evenly work was shared.

use clap::Parser;
use fairway_bench::args::BenchArgs;
use fairway_broker::db::sql::Statement;
use fairway_broker::statements::counters::CheckConsistency;
use serde_json::{json, Value};

// Only the connection helpers are used here.
#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use helpers::{connect, server_url};

/// `fairway bench`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct BenchCli {
    #[command(flatten)]
    args: BenchArgs,
}

/// Every run recreates the one database `fairway bench` measures in: one run at a time.
static BENCH_DATABASE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `fairway bench` with `flags` against the test server, for 1 s a path, without the
/// wake-up, competing-tenants, many-services and policies runs (unless `flags` ask), and returns
/// what it wrote.
/// Callers hold BENCH_DATABASE.
async fn bench(flags: &[&str]) -> Value {
    let url = server_url().await;
    let dir = std::env::temp_dir().join(format!("fairway-bench-{}", uuid::Uuid::new_v4()));
    let json = dir.join("results.json");
    let path = json.to_str().expect("a UTF-8 path");
    let common = ["fairway-bench", "--database-url", &url, "--json", path, "--duration", "1s"];
    let rest = ["--wakeup-trials", "0", "--competing-tenants", "0"];
    let policies: &[&str] =
        if flags.contains(&"--policy-users") { &[] } else { &["--policy-users", "0"] };
    let one_service: &[&str] =
        if flags.contains(&"--services-per-user") { &[] } else { &["--services-per-user", "0"] };
    let cli = BenchCli::parse_from(
        common.iter().chain(&rest).chain(policies).chain(one_service).chain(flags),
    );
    let args = cli.args;
    fairway_bench::run(args).await.expect("every path ran without error");
    let text = std::fs::read_to_string(&json).expect("results");
    let _ = std::fs::remove_dir_all(dir);
    serde_json::from_str(&text).expect("JSON")
}

/// A small seed with several jobs a user, over tenants and components, with as many workers as
/// every path needs, and the wide claims at its one point.
const SEVERAL_JOBS_A_USER: &[&str] = &[
    "--users",
    "4",
    "--jobs-per-user",
    "3",
    "--tenants",
    "2",
    "--components",
    "2",
    "--backlog",
    "600",
    "--workers",
    "4",
    "--wide-points",
    "4x600",
];

#[tokio::test]
async fn every_path_runs_on_a_seed_of_several_jobs_per_user_and_counters_stay_exact() {
    // Held through the recount below, which reads the database the run left.
    let _only = BENCH_DATABASE.lock().await;
    let paths = "fair,fifo,fifo_batched,fifo_counted,fifo_user_counted,harmony_least_running,\
                 harmony_round_robin,http,http_3_brokers";
    let report = bench(&[SEVERAL_JOBS_A_USER, &["--paths", paths]].concat()).await;
    let runs = report["runs"].as_array().expect("runs");
    let legs: Vec<(&str, i64)> =
        runs.iter().filter_map(|run| Some((run["path"].as_str()?, run["max"].as_i64()?))).collect();
    let one = [
        "fair",
        "fifo",
        "fifo_batched",
        "fifo_counted",
        "fifo_user_counted",
        "harmony_least_running",
        "harmony_round_robin",
        "http",
        "http_3_brokers",
    ]
    .map(|path| (path, 1));
    let wide =
        ["fair", "fifo", "fifo_batched", "fifo_counted", "fifo_user_counted"].map(|path| (path, 8));
    assert_eq!(legs, [&wide[..], &one[..]].concat(), "the wide claims, then each path");
    for run in runs {
        assert_eq!(run["jobs"], 12, "{run}");
        assert!(run["claims_per_s"].as_f64().is_some_and(|rate| rate > 0.0), "{run}");
        assert!(run["wal_bytes_per_claim"].as_f64().is_some_and(|bytes| bytes > 0.0), "{run}");
    }

    // The last path, over HTTP to three brokers, keeps the broker's counters: a recount finds
    // nothing to mend.
    assert_counters_exact().await;
}

/// The counted FIFO, the ceiling for a claim that keeps the fair order's counters, keeps them
/// as exactly as the broker does, over claims of one item and of several, across tenants,
/// components and several jobs per user.
#[tokio::test]
async fn the_counted_fifo_keeps_the_fair_orders_counters_exact() {
    let _only = BENCH_DATABASE.lock().await;
    let report = bench(&[SEVERAL_JOBS_A_USER, &["--paths", "fifo_counted"]].concat()).await;
    let legs: Vec<i64> = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|run| run["max"].as_i64())
        .collect();
    assert_eq!(legs, [8, 1], "the wide claims, then one item a claim");
    assert_counters_exact().await;
}

/// The user-counted FIFO, the ceiling for a claim that keeps only the users' queue rows,
/// really writes them: after claims of one item and of several, across tenants, components and
/// several jobs per user, every queue row's ready count is its queue's ready items, and its work
/// in progress its user's running items. (A statement that matched no counter row would leave
/// the seeded counts, and measure a ceiling that pays for nothing.)
#[tokio::test]
async fn the_user_counted_fifo_keeps_the_users_queue_rows_exact() {
    let _only = BENCH_DATABASE.lock().await;
    let report = bench(&[SEVERAL_JOBS_A_USER, &["--paths", "fifo_user_counted"]].concat()).await;
    let runs = report["runs"].as_array().expect("runs");
    let legs: Vec<i64> = runs.iter().filter_map(|run| run["max"].as_i64()).collect();
    assert_eq!(legs, [8, 1], "the wide claims, then one item a claim");
    let db = bench_database().await;
    let queues = "SELECT su.username, su.component, su.tenant, su.ready_count, su.running_count,
                         count(wi.id) FILTER (WHERE wi.status = 'ready'
                                                AND wi.component = su.component
                                                AND j.tenant = su.tenant)::integer,
                         count(wi.id) FILTER (WHERE wi.status = 'running')::integer
                    FROM service_users su
                    LEFT JOIN jobs j ON j.username = su.username
                    LEFT JOIN work_items wi ON wi.job_id = j.job_id
                   GROUP BY su.username, su.component, su.tenant, su.ready_count,
                            su.running_count";
    let rows = db.query(queues, &[]).await.expect("queue rows");
    assert_eq!(rows.len(), 4, "a queue row per user");
    let mut still_ready = 0;
    for row in &rows {
        let (user, component): (String, String) = (row.get(0), row.get(1));
        let (ready_count, running_count): (i32, i32) = (row.get(3), row.get(4));
        let (ready, running): (i32, i32) = (row.get(5), row.get(6));
        assert_eq!((ready_count, running_count), (ready, running), "{user} {component}");
        still_ready += ready;
    }
    assert!(still_ready < 600, "the run's last pass claimed some of the 600 items");
}

/// The policies' point seeds weights, caps and rate limits through the broker's own statement,
/// measures `fair` with and without them, reports Jain's index over items served by weight, and
/// leaves the counters exact.
#[tokio::test]
async fn the_policies_point_runs_with_and_without_policies_and_counters_stay_exact() {
    let _only = BENCH_DATABASE.lock().await;
    let flags =
        ["--points", "4x600", "--paths", "fair", "--wide-max", "1", "--policy-users", "100"];
    let report = bench(&flags).await;
    let runs = report["runs"].as_array().expect("runs");
    let legs: Vec<&str> = runs.iter().filter_map(|run| run["path"].as_str()).collect();
    assert_eq!(legs, ["fair", "fair_no_policies", "fair_policies"]);
    for run in &runs[1..] {
        assert_eq!((&run["users"], &run["errors"]), (&json!(100), &json!(0)), "{run}");
        assert!(run["claims_per_s"].as_f64().is_some_and(|rate| rate > 0.0), "{run}");
        assert!(run["jain"].as_f64().is_some(), "{run}");
    }
    // The bound counts whole items per user, which weighted shares are not.
    assert!(runs[2]["jain_bound"].is_null(), "{}", runs[2]);
    assert!(runs[1]["jain_bound"].as_f64().is_some(), "{}", runs[1]);
    assert_counters_exact().await;
}

/// The lanes' point measures one service, then two services side by side, each claimed by half
/// the workers, with the share of users asked for having work in both; counters stay exact.
#[tokio::test]
async fn the_lanes_point_runs_one_service_then_two_with_shared_users() {
    let _only = BENCH_DATABASE.lock().await;
    let flags =
        ["--points", "4x600", "--paths", "fair", "--wide-max", "1", "--lane-shares", "0,50"];
    let report = bench(&flags).await;
    let runs = report["runs"].as_array().expect("runs");
    let legs: Vec<&str> = runs.iter().filter_map(|run| run["path"].as_str()).collect();
    assert_eq!(legs, ["fair", "fair_one_lane", "fair_two_lanes_0", "fair_two_lanes_50"]);
    for run in &runs[1..] {
        assert_eq!((&run["users"], &run["errors"]), (&json!(1000), &json!(0)), "{run}");
        assert!(run["claims_per_s"].as_f64().is_some_and(|rate| rate > 0.0), "{run}");
        let contention = &run["contention"];
        assert!(contention["deferrals"].as_f64().is_some_and(|count| count >= 0.0), "{run}");
        assert!(contention["row_lock_wait_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{run}");
    }
    let db = bench_database().await;
    let in_both = "SELECT count(*) FROM (SELECT username FROM user_work GROUP BY username
                                        HAVING count(DISTINCT service) = 2) shared";
    let shared: i64 = db.query_one(in_both, &[]).await.expect("users in both").get(0);
    assert_eq!(shared, 500, "half the users have work in both services");
    let worked: i64 = db
        .query_one("SELECT count(DISTINCT service) FROM user_work WHERE successful_count > 0", &[])
        .await
        .expect("services worked in")
        .get(0);
    assert_eq!(worked, 2, "the workers claimed from both services");
    assert_counters_exact().await;
}

/// With ready work in three services a user keeps exact counters, though a claim moves only the
/// queue row it claims from and an ending only the rows that would lead, whether the workers
/// claim from one service or from all three; and the WAL says what each claim wrote.
#[tokio::test]
async fn work_in_several_services_keeps_the_counters_exact_and_writes_are_counted() {
    let _only = BENCH_DATABASE.lock().await;
    let flags =
        ["--points", "4x600", "--paths", "fair", "--wide-max", "1", "--services-per-user", "3"];
    let report = bench(&flags).await;
    let runs = report["runs"].as_array().expect("runs");
    let legs: Vec<&str> = runs.iter().filter_map(|run| run["path"].as_str()).collect();
    assert_eq!(legs, ["fair", "fair_services", "fair_every_service"]);
    for run in runs {
        assert_eq!(run["errors"], 0, "{run}");
        // A claim with its completion writes at least the item twice and a counter row.
        let rows = run["writes"]["rows"].as_f64().expect("rows written, from the WAL");
        assert!(rows >= 3.0, "{run}");
        assert!(run["writes"]["index_entries"].as_f64().is_some_and(|n| n >= 2.0), "{run}");
    }
    let db = bench_database().await;
    let services: i64 = db
        .query_one("SELECT count(DISTINCT service) FROM service_users WHERE ready_count > 0", &[])
        .await
        .expect("services with ready work")
        .get(0);
    assert_eq!(services, 3, "every user has ready work in three services");
    let worked: i64 = db
        .query_one("SELECT count(DISTINCT service) FROM user_work WHERE successful_count > 0", &[])
        .await
        .expect("services worked in")
        .get(0);
    assert_eq!(worked, 3, "the last run's workers claimed from every service");
    assert_counters_exact().await;
}

/// A connection to the database `fairway bench` measures in.
async fn bench_database() -> tokio_postgres::Client {
    let server = fairway_pg::Database::parse(&server_url().await).expect("DATABASE_URL parses");
    connect(&server.with_dbname("fairway_bench")).await
}

/// The lock-wait sampler behind each run's contention counts the time a backend waits for a
/// row another transaction holds.
#[tokio::test]
async fn the_lock_wait_sampler_counts_a_backend_waiting_for_a_row() {
    let _only = BENCH_DATABASE.lock().await;
    let server = fairway_pg::Database::parse(&server_url().await).expect("DATABASE_URL parses");
    let holder = connect(&server).await;
    let waiter = connect(&server).await;
    // Outside any transaction, so that each look at pg_stat_activity is fresh.
    let observer = connect(&server).await;
    let table = format!("lock_sampler_{}", uuid::Uuid::new_v4().simple());
    holder
        .batch_execute(&format!(
            "CREATE TABLE {table} (id integer PRIMARY KEY); INSERT INTO {table} VALUES (1)"
        ))
        .await
        .expect("a table of one row");
    holder
        .batch_execute(&format!("BEGIN; SELECT * FROM {table} FOR UPDATE"))
        .await
        .expect("hold the row");
    let sampler = fairway_bench::LockWaits::sample(&server).await.expect("sampler starts");
    let take_the_row = format!("SELECT * FROM {table} FOR UPDATE");
    let waiting = tokio::spawn(async move { waiter.batch_execute(&take_the_row).await });
    // Until the server has seen the waiter wait for 300 ms; the bound only turns a hang into a
    // failure.
    let waited_long = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                    WHERE wait_event_type = 'Lock'
                                      AND clock_timestamp() - query_start > interval '300 ms')";
    let waited = async {
        while !observer.query_one(waited_long, &[]).await.expect("activity").get::<_, bool>(0) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), waited)
        .await
        .expect("the waiter never waited 300 ms for the row");
    holder.batch_execute("COMMIT").await.expect("let the row go");
    waiting.await.expect("waiter").expect("the waiter got the row");
    let waited_ms = sampler.stop().await.expect("sampler stops");
    holder.batch_execute(&format!("DROP TABLE {table}")).await.expect("drop the table");
    assert!((200.0..60_000.0).contains(&waited_ms), "sampled {waited_ms} ms of lock waits");
}

/// A recount of the database the last run left finds nothing to mend.
async fn assert_counters_exact() {
    let db = bench_database().await;
    let mismatches = db.query(CheckConsistency::SQL, &[]).await.expect("recount");
    let rows: Vec<String> = mismatches
        .iter()
        .map(|row| {
            let (table, key): (String, Value) = (row.get(0), row.get(1));
            let (recorded, actual): (Value, Value) = (row.get(2), row.get(3));
            format!("{table} {key}: recorded {recorded}, actual {actual}")
        })
        .collect();
    assert!(mismatches.is_empty(), "{} counters drifted: {rows:?}", mismatches.len());
}

/// A backlog too small to have a half ends its path after one pass that hands out nothing,
/// rather than going over it again for ever.
#[tokio::test]
async fn a_backlog_too_small_to_halve_ends_the_run() {
    let _only = BENCH_DATABASE.lock().await;
    let flags = ["--users", "1", "--backlog", "1", "--paths", "fair", "--wide-max", "1"];
    // Generous: the run takes a few seconds; before the fix it never ended.
    let report = tokio::time::timeout(std::time::Duration::from_secs(120), bench(&flags))
        .await
        .expect("the run ended");
    assert_eq!(report["runs"][0]["path"], "fair");
}
