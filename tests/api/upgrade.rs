//! A rolling upgrade under load, as `make upgrade-test` runs it. Two brokers of the previous
//! release serve behind a proxy that routes only to the brokers in its endpoint list, as a
//! Kubernetes Service does. Workers of that release run a real command, and producers submit
//! throughout. Each broker is then replaced in turn: by this build, then by the drill release
//! (this tree one server function and one migration on, built with the test-only
//! `upgrade-drill` feature), restarting a broker of this build in the middle, and back to this
//! build. Every job succeeds, every item runs once, no answer is a 5xx but a draining broker's
//! 503, no broker logs an error, and the counters hold.
//!
//! The previous release and the drill are binaries that `make upgrade-test` builds and names in
//! FAIRWAY_PREVIOUS_RELEASE and FAIRWAY_DRILL_RELEASE; without them the test fails.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use fairway_broker::db::functions;
use fairway_pg::Database;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use uuid::Uuid;

use crate::brokers_away::{assert_consistent, await_successful};
use crate::helpers::{connect, empty_database};
use crate::shutdown::{await_ready, connection_string, free_port};

/// How long a new broker and the one it replaces both serve before the old one leaves.
const BOTH_SERVE: Duration = Duration::from_secs(3);
/// How often the producers submit a job, of [`ITEMS_PER_JOB`] items, for one of [`USERS`].
const SUBMIT_EVERY: Duration = Duration::from_millis(100);
const ITEMS_PER_JOB: usize = 3;
const USERS: usize = 4;
/// Worker processes, each running this many commands at once.
const WORKERS: usize = 3;
const CONCURRENCY: &str = "4";
/// How soon a set of server functions nobody uses is dropped: short, so that the test sees the
/// drill's set go once the roll back is done.
const FUNCTION_SET_RETENTION: &str = "4s";

/// A release the test runs brokers of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Release {
    Previous,
    Current,
    Drill,
}

impl Release {
    fn binary(self) -> PathBuf {
        let named = |variable: &str| {
            let path = std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| {
                panic!("{variable} names no binary: run this test with `make upgrade-test`")
            });
            assert!(path.is_file(), "{variable}: no file at {}", path.display());
            path
        };
        match self {
            Self::Previous => named("FAIRWAY_PREVIOUS_RELEASE"),
            Self::Current => PathBuf::from(env!("CARGO_BIN_EXE_fairway")),
            Self::Drill => named("FAIRWAY_DRILL_RELEASE"),
        }
    }
}

/// One answer the proxy passed on.
struct Answer {
    at: Instant,
    path: String,
    status: u16,
    /// The error's code, for an answer of 500 or more.
    code: Option<String>,
}

/// The Service in front of the brokers: each request goes to the next broker of its endpoint
/// list, whose changes apply to the requests that follow.
#[derive(Clone, Default)]
struct Routes {
    endpoints: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicUsize>,
    answers: Arc<Mutex<Vec<Answer>>>,
}

impl Routes {
    fn add(&self, base: &str) {
        self.endpoints.lock().expect("endpoints").push(base.to_owned());
    }

    fn remove(&self, base: &str) {
        self.endpoints.lock().expect("endpoints").retain(|endpoint| endpoint != base);
    }

    fn pick(&self) -> String {
        let endpoints = self.endpoints.lock().expect("endpoints");
        assert!(!endpoints.is_empty(), "the proxy has no endpoint");
        endpoints[self.next.fetch_add(1, Ordering::Relaxed) % endpoints.len()].clone()
    }
}

async fn forward(
    request: HttpRequest,
    body: web::Bytes,
    routes: web::Data<Routes>,
    http: web::Data<reqwest::Client>,
) -> HttpResponse {
    let target = format!("{}{}", routes.pick(), request.uri());
    let method =
        reqwest::Method::from_bytes(request.method().as_str().as_bytes()).expect("a method");
    let mut outgoing = http.request(method, target).body(body.to_vec());
    for (name, value) in request.headers() {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            outgoing = outgoing.header(name.as_str(), value.as_bytes());
        }
    }
    let path = request.path().to_owned();
    let (status, headers, body) = match outgoing.send().await {
        Ok(answer) => {
            let status = answer.status().as_u16();
            let headers = answer.headers().clone();
            (status, headers, answer.bytes().await.unwrap_or_default().to_vec())
        }
        Err(error) => (502, reqwest::header::HeaderMap::new(), error.to_string().into_bytes()),
    };
    let code = (status >= 500).then(|| {
        serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|body| body["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned())
    });
    routes.answers.lock().expect("answers").push(Answer { at: Instant::now(), path, status, code });
    let mut answer =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("a status"));
    for (name, value) in &headers {
        if !matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection") {
            answer.insert_header((name.as_str(), value.as_bytes()));
        }
    }
    answer.body(body)
}

/// Starts the proxy; its URL.
fn start_proxy(routes: &Routes) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let (routes, http) = (web::Data::new(routes.clone()), web::Data::new(reqwest::Client::new()));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(routes.clone())
            .app_data(http.clone())
            .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
            .default_service(web::to(forward))
    })
    .workers(2)
    .listen(listener)
    .expect("listen")
    .run();
    tokio::spawn(server);
    url
}

/// A broker process, its address and its log.
struct Broker {
    release: Release,
    child: Child,
    base: String,
    log: PathBuf,
}

async fn start_broker(release: Release, database: &Database, dir: &Path, n: usize) -> Broker {
    let address = format!("127.0.0.1:{}", free_port());
    let log = dir.join(format!("broker-{n}-{release:?}.log"));
    let file = std::fs::File::create(&log).expect("a log file");
    let child = Command::new(release.binary())
        .args(["serve", "--bind", &address, "--log-format", "json"])
        .args(["--shutdown-timeout", "10s", "--lease", "30s"])
        .env("DATABASE_URL", connection_string(database))
        .env("FAIRWAY_NO_EMBEDDED_POSTGRES", "true")
        .env("FAIRWAY_FUNCTION_SET_RETENTION", FUNCTION_SET_RETENTION)
        .stdout(file.try_clone().expect("the log file"))
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("start a broker");
    let base = format!("http://{address}");
    await_ready(&base, Duration::from_secs(60)).await;
    Broker { release, child, base, log }
}

/// SIGTERM, as Kubernetes stops a pod, then the drain; the broker must exit cleanly.
async fn stop(mut process: Child, what: &str) {
    let pid = Pid::from_raw(process.id().expect("running") as i32);
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(30), process.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within 30 s"))
        .expect("wait");
    assert!(status.success(), "{what} exited with {status}");
}

/// The brokers behind the proxy, and the logs of those that stopped.
struct Fleet {
    routes: Routes,
    database: Database,
    dir: PathBuf,
    serving: Vec<Broker>,
    logs: Vec<PathBuf>,
    started: usize,
}

impl Fleet {
    async fn start(&mut self, release: Release) {
        self.started += 1;
        let broker = start_broker(release, &self.database, &self.dir, self.started).await;
        self.routes.add(&broker.base);
        self.serving.push(broker);
    }

    /// Replaces the broker at `slot` by one of `release`, as a rolling update does: the new
    /// one is ready and serves beside it, then the old one leaves the endpoints and stops.
    async fn replace(&mut self, slot: usize, release: Release) {
        self.start(release).await;
        tokio::time::sleep(BOTH_SERVE).await;
        let old = self.serving.remove(slot);
        self.routes.remove(&old.base);
        stop(old.child, &format!("the {:?} broker at {}", old.release, old.base)).await;
        self.logs.push(old.log);
        let new = self.serving.pop().expect("the new broker");
        self.serving.insert(slot, new);
    }

    fn releases(&self) -> Vec<Release> {
        self.serving.iter().map(|broker| broker.release).collect()
    }
}

/// Which schema's functions the trigger bindings call, and the sets the database records.
async fn function_sets(database: &Database) -> (Vec<String>, Vec<String>) {
    let db = connect(database).await;
    let owners = db
        .query(
            "SELECT DISTINCT n.nspname::text
               FROM pg_trigger t
               JOIN pg_proc p ON p.oid = t.tgfoid
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE NOT t.tgisinternal",
            &[],
        )
        .await
        .expect("trigger owners")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let sets = db
        .query("SELECT schema_name FROM function_sets ORDER BY revision", &[])
        .await
        .expect("function sets")
        .iter()
        .map(|row| row.get(0))
        .collect();
    (owners, sets)
}

/// The drill's schema, as its broker reports it.
async fn schema_of(base: &str) -> String {
    let version: Value = reqwest::get(format!("{base}/admin/version"))
        .await
        .expect("version")
        .json()
        .await
        .expect("JSON");
    version["functions_schema"].as_str().expect("a schema").to_owned()
}

/// Submits a job every [`SUBMIT_EVERY`] until `stop`, each with an idempotency key, sent again
/// after a draining broker's 503; the jobs' ids.
async fn produce(url: String, stop: Arc<AtomicBool>) -> Vec<Uuid> {
    let http = reqwest::Client::new();
    let mut jobs = Vec::new();
    let mut ticker = tokio::time::interval(SUBMIT_EVERY);
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        let n = jobs.len();
        let key = format!("upgrade-job-{n}");
        let items: Vec<Value> = (0..ITEMS_PER_JOB).map(|i| json!({"payload": {"i": i}})).collect();
        let body = json!({
            "user": format!("user-{}", n % USERS),
            "steps": [{"service": "render"}],
            "items": items,
        });
        loop {
            let answer = http
                .post(format!("{url}/jobs"))
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
                .await
                .expect("the proxy answers");
            match answer.status() {
                StatusCode::CREATED | StatusCode::OK => {
                    let answer: Value = answer.json().await.expect("JSON");
                    jobs.push(
                        answer["job_id"].as_str().and_then(|id| id.parse().ok()).expect("id"),
                    );
                    break;
                }
                StatusCode::SERVICE_UNAVAILABLE => tokio::time::sleep(SUBMIT_EVERY).await,
                status => panic!(
                    "a submit was answered {status}: {}",
                    answer.text().await.unwrap_or_default()
                ),
            }
        }
    }
    jobs
}

/// A worker of the previous release, running a command that records each item it is given in
/// a file of its own under `runs`.
fn start_worker(url: &str, runs: &Path, log: &Path) -> Child {
    let file = std::fs::File::create(log).expect("a log file");
    Command::new(Release::Previous.binary())
        .args(["worker", "--url", url, "--service", "render", "--concurrency", CONCURRENCY])
        .args(["--wait", "5s", "--log-format", "json", "--"])
        .args(["sh", "-c", r#"f=$(mktemp "$0/run.XXXXXXXX") && cat > "$f" && echo "[]""#])
        .arg(runs)
        .stdout(file.try_clone().expect("the log file"))
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("start a worker")
}

#[tokio::test]
#[ignore = "`make upgrade-test` runs it, with the previous release and the drill it builds"]
async fn a_rolling_upgrade_and_its_rollback_under_load_lose_nothing() {
    let (previous, drill) = (Release::Previous.binary(), Release::Drill.binary());
    println!("previous release: {}\ndrill release: {}", previous.display(), drill.display());
    let dir = std::env::temp_dir().join(format!("fairway-upgrade-{}", Uuid::new_v4().simple()));
    let runs = dir.join("runs");
    std::fs::create_dir_all(&runs).expect("a scratch folder");
    let database = empty_database().await;
    let routes = Routes::default();
    let url = start_proxy(&routes);
    let mut fleet = Fleet {
        routes: routes.clone(),
        database: database.clone(),
        dir: dir.clone(),
        serving: Vec::new(),
        logs: Vec::new(),
        started: 0,
    };
    fleet.start(Release::Previous).await;
    fleet.start(Release::Previous).await;

    let workers: Vec<Child> = (0..WORKERS)
        .map(|n| start_worker(&url, &runs, &dir.join(format!("worker-{n}.log"))))
        .collect();
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce(url.clone(), stop_producing.clone()));
    tokio::time::sleep(BOTH_SERVE).await;
    let roll_started = Instant::now();

    // Forward: the previous release to this build.
    fleet.replace(0, Release::Current).await;
    fleet.replace(1, Release::Current).await;
    let (owners, sets) = function_sets(&database).await;
    assert_eq!(
        (owners, sets),
        (vec![functions::schema().to_owned()], vec![functions::schema().to_owned()])
    );

    // To the drill, restarting a broker of this build while the drill's runs beside it.
    fleet.replace(0, Release::Drill).await;
    let drill_schema = schema_of(&fleet.serving[0].base).await;
    assert_ne!(drill_schema, functions::schema());
    assert_eq!(
        function_sets(&database).await.0,
        [drill_schema.as_str()],
        "the newer set owns the triggers"
    );
    fleet.replace(1, Release::Current).await;
    assert_eq!(
        function_sets(&database).await.0,
        [drill_schema.as_str()],
        "an older start keeps off"
    );
    fleet.replace(1, Release::Drill).await;
    assert_eq!(fleet.releases(), [Release::Drill, Release::Drill]);

    // And back.
    fleet.replace(0, Release::Current).await;
    fleet.replace(1, Release::Current).await;
    let roll = roll_started.elapsed();
    tokio::time::sleep(BOTH_SERVE).await;
    stop_producing.store(true, Ordering::Relaxed);
    let jobs = producer.await.expect("the producer");

    // Every job succeeds.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for job in &jobs {
        let within = deadline.saturating_duration_since(Instant::now());
        await_successful(&http, &url, &job.to_string(), within).await;
    }

    // The drill's set goes once nobody uses it, and this build's set takes the triggers back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (owners, sets) = function_sets(&database).await;
        if owners == [functions::schema()] && sets == [functions::schema()] {
            break;
        }
        assert!(Instant::now() < deadline, "the drill's set stays: {owners:?}, {sets:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    assert_consistent(&http, &url).await;
    for worker in workers {
        stop(worker, "a worker").await;
    }
    for broker in std::mem::take(&mut fleet.serving) {
        stop(broker.child, "a broker").await;
        fleet.logs.push(broker.log);
    }

    // Every item ran once.
    let mut runs_by_item: HashMap<i64, usize> = HashMap::new();
    let mut jobs_run: HashSet<String> = HashSet::new();
    for entry in std::fs::read_dir(&runs).expect("the runs") {
        let text = std::fs::read_to_string(entry.expect("a run").path()).expect("a run's item");
        let item: Value = serde_json::from_str(&text).expect("the item's JSON");
        *runs_by_item.entry(item["id"].as_i64().expect("an id")).or_default() += 1;
        jobs_run.insert(item["job_id"].as_str().expect("a job").to_owned());
    }
    let twice: Vec<_> = runs_by_item.iter().filter(|(_, runs)| **runs > 1).collect();
    assert!(twice.is_empty(), "items run more than once: {twice:?}");
    assert_eq!(runs_by_item.len(), jobs.len() * ITEMS_PER_JOB, "every item ran");
    assert_eq!(jobs_run.len(), jobs.len());

    // The drill's functions served too: they mark the jobs they finish.
    let db = connect(&database).await;
    let finished_by_drill: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE finished_by_drill", &[])
        .await
        .expect("count")
        .get(0);
    assert!(finished_by_drill > 0, "no job was finished by the drill's functions");

    // No 5xx but a draining broker's 503, and no broker logged an error.
    let answers = routes.answers.lock().expect("answers");
    let failures: Vec<String> = answers
        .iter()
        .filter(|answer| answer.status >= 500)
        .filter(|answer| !(answer.status == 503 && answer.code.as_deref() == Some("shutting_down")))
        .map(|answer| format!("{} {}: {:?}", answer.status, answer.path, answer.code))
        .collect();
    assert!(failures.is_empty(), "answers of 5xx: {failures:?}");
    for log in &fleet.logs {
        let text = std::fs::read_to_string(log).expect("a broker's log");
        let errors: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("\"level\":\"ERROR\"") || !line.starts_with('{'))
            .collect();
        assert!(errors.is_empty(), "{} logged errors: {errors:#?}", log.display());
    }

    // The figures for the record.
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for answer in answers.iter() {
        *by_status.entry(answer.status).or_default() += 1;
    }
    let mut claims: Vec<Instant> = answers
        .iter()
        .filter(|answer| answer.path == "/work" && answer.status == 200)
        .map(|answer| answer.at)
        .filter(|at| *at >= roll_started && *at <= roll_started + roll)
        .collect();
    claims.sort();
    let longest = claims.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
    println!(
        "upgrade: {} jobs, {} items, each run once; {} finished by the drill's functions\n\
         answers by status: {by_status:?}\n\
         roll: 7 broker replacements in {:.1} s; longest stretch with no claim answered: {} ms",
        jobs.len(),
        runs_by_item.len(),
        finished_by_drill,
        roll.as_secs_f64(),
        longest.as_millis()
    );
    drop(answers);
    let _ = std::fs::remove_dir_all(&dir);
}
