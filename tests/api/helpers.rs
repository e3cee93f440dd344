//! One harness for every API test: each test gets a broker on its own port, over its own
//! database cloned from a migrated template, on a real PostgreSQL.

use std::future::Future;
use std::time::Duration;

use fairway_pg::Database;
use fairway_server::config::{AuthArgs, ServeArgs};
use fairway_server::startup::Application;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// The migrated database every test database is cloned from; set up once per process.
static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// Serialises template creation between test processes (nextest runs one per test).
const TEMPLATE_LOCK: i64 = 0x7465_6d70_6c61_7465;

/// The server that holds the test databases: DATABASE_URL, else (with the `containers` feature)
/// a PostgreSQL container.
pub async fn server_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    #[cfg(feature = "containers")]
    {
        return containers::server_url().await;
    }
    #[allow(unreachable_code)]
    {
        panic!("set DATABASE_URL to a PostgreSQL server the tests may create databases on, or run `make test`");
    }
}

#[cfg(feature = "containers")]
mod containers {
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::runners::AsyncRunner;
    use testcontainers_modules::testcontainers::ContainerAsync;
    use tokio::sync::OnceCell;

    static CONTAINER: OnceCell<(ContainerAsync<Postgres>, String)> = OnceCell::const_new();

    pub async fn server_url() -> String {
        let (_, url) = CONTAINER
            .get_or_init(|| async {
                let container =
                    Postgres::default().start().await.expect("start a PostgreSQL container");
                let port = container.get_host_port_ipv4(5432).await.expect("container port");
                let url = format!(
                    "host=127.0.0.1 port={port} user=postgres password=postgres dbname=postgres"
                );
                (container, url)
            })
            .await;
        url.clone()
    }
}

fn database(url: &str) -> Database {
    Database::parse(url).expect("DATABASE_URL parses")
}

/// A connection to the server's own database, for what the tests do to whole databases.
pub async fn server_connection() -> tokio_postgres::Client {
    connect(&database(&server_url().await)).await
}

/// A connection that, like the broker's, finds this build's server functions first.
pub async fn connect(database: &Database) -> tokio_postgres::Client {
    let config = fairway_broker::db::pool::with_search_path(database.config());
    let (client, connection) = config.connect(database.tls()).await.expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A name for the template that changes whenever the schema does (a migration or a function).
fn template_name() -> String {
    format!("fairway_template_{}", &fairway_broker::db::migrations::digest()[..16])
}

async fn template(url: &str) -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let name = template_name();
            let admin = connect(&database(url)).await;
            admin.execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK]).await.expect("lock");
            let exists = admin
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                .await
                .expect("look up template")
                .is_some();
            if !exists {
                admin
                    .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                    .await
                    .expect("create template");
                let pool = fairway_broker::db::pool::connect(&database(url).with_dbname(&name), 1)
                    .expect("pool");
                fairway_broker::db::migrations::run(&pool).await.expect("migrate template");
                pool.close();
            }
            admin
                .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK])
                .await
                .expect("unlock");
            name
        })
        .await
}

/// Creates a fresh, migrated database and returns its connection config.
pub async fn fresh_database() -> Database {
    let url = server_url().await;
    let template = template(&url).await;
    create_database(&url, &format!("TEMPLATE \"{template}\"")).await
}

/// Creates a database with no schema at all and returns its connection config.
pub async fn empty_database() -> Database {
    create_database(&server_url().await, "").await
}

async fn create_database(url: &str, options: &str) -> Database {
    let name = format!("fairway_test_{}", Uuid::new_v4().simple());
    let admin = connect(&database(url)).await;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\" {options}"))
        .await
        .expect("create test database");
    database(url).with_dbname(&name)
}

/// The bootstrap admin token (FAIRWAY_ADMIN_TOKEN) of brokers spawned with auth.
pub const ADMIN_TOKEN: &str = "fw_test-admin-0123456789abcdef0123456789abcdef";

/// `ServeArgs::for_tests()` with auth on: FAIRWAY_ADMIN_TOKEN set, and a one-second token cache, so
/// that a revocation shows quickly.
pub fn auth_args() -> ServeArgs {
    ServeArgs {
        auth: AuthArgs {
            admin_token: Some(ADMIN_TOKEN.to_owned()),
            auth_cache_ttl: Duration::from_secs(1),
            ..AuthArgs::default()
        },
        ..ServeArgs::for_tests()
    }
}

/// A broker with auth on, whose helpers send the admin token.
pub async fn spawn_app_with_auth() -> TestApp {
    spawn_app_with(auth_args()).await
}

pub struct TestApp {
    pub address: String,
    /// The bearer token the helpers send: the admin token of a broker spawned with auth.
    pub token: Option<String>,
    /// The broker behind `address`, for what a test runs in-process (a pruning pass).
    pub broker: fairway_broker::Broker,
    pub http: reqwest::Client,
    pub db: tokio_postgres::Client,
    pub config: Database,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(ServeArgs::for_tests()).await
}

pub async fn spawn_app_with(args: ServeArgs) -> TestApp {
    let config = fresh_database().await;
    spawn_broker(args, config).await
}

/// Starts one more broker on an existing database, as a second broker process would.
pub async fn spawn_broker(args: ServeArgs, config: Database) -> TestApp {
    spawn_broker_for(args, config, reqwest::Client::new()).await
}

/// As [`spawn_broker`], with the helpers' requests sent by `http`: over HTTPS when `args`
/// name a certificate, by a client that trusts its CA.
pub async fn spawn_broker_for(args: ServeArgs, config: Database, http: reqwest::Client) -> TestApp {
    let app = Application::build(&args, config.clone()).await.expect("build the broker");
    let scheme = if args.tls.tls_cert.is_some() { "https" } else { "http" };
    let address = format!("{scheme}://127.0.0.1:{}", app.port());
    let broker = app.broker().clone();
    tokio::spawn(app.run_until_stopped());
    let db = connect(&config).await;
    let token = args.auth.admin_token.clone();
    TestApp { address, token, broker, http, db, config }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// A request to `path`, with the app's token if it has one.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, self.url(path));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.request(reqwest::Method::POST, path).json(body).send().await.expect("POST")
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request(reqwest::Method::GET, path).send().await.expect("GET")
    }

    /// Submits a job and returns its id.
    pub async fn submit(&self, body: Value) -> Uuid {
        let response = self.post("/jobs", &body).await;
        assert_eq!(response.status(), StatusCode::CREATED, "submit {body}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["status"], "accepted");
        body["job_id"].as_str().and_then(|id| id.parse().ok()).expect("job id")
    }

    /// Submits a one-step job of `items` items for `user` on `service`.
    pub async fn submit_simple(
        &self,
        user: &str,
        service: &str,
        items: usize,
        is_async: bool,
    ) -> Uuid {
        let items: Vec<Value> = (0..items).map(|n| json!({ "payload": { "n": n } })).collect();
        self.submit(json!({
            "user": user,
            "is_async": is_async,
            "steps": [{ "service": service }],
            "items": items,
        }))
        .await
    }

    /// GET /work; an empty list for 204.
    pub async fn claim_with(&self, query: &str) -> Vec<Value> {
        let response = self.get(&format!("/work?{query}")).await;
        match response.status() {
            StatusCode::NO_CONTENT => Vec::new(),
            StatusCode::OK => {
                let body: Value = response.json().await.expect("JSON");
                body["work_items"].as_array().cloned().expect("work_items")
            }
            status => {
                panic!("GET /work?{query}: {status} {}", response.text().await.unwrap_or_default())
            }
        }
    }

    /// Claims at most one item of `service` as worker 0 of querier `pod-0`.
    pub async fn claim(&self, service: &str) -> Option<Value> {
        self.claim_with(&format!("service={service}&querier=pod-0")).await.pop()
    }

    pub async fn report(&self, item: &Value, body: Value) -> Response {
        let id = item["id"].as_i64().expect("item id");
        self.post(&format!("/work/{id}/status"), &body).await
    }

    /// Reports success with `results` and asserts it was accepted.
    pub async fn succeed(&self, item: &Value, results: Value) {
        let response = self
            .report(
                item,
                json!({ "status": "successful", "attempt": item["attempt"], "results": results }),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{}",
            response.text().await.unwrap_or_default()
        );
    }

    pub async fn job(&self, job_id: Uuid) -> Value {
        let response = self.get(&format!("/jobs/{job_id}")).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.expect("JSON")
    }

    /// Asserts that every counter equals a recount of the work items.
    pub async fn assert_consistent(&self) {
        let response = self.get("/admin/consistency").await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["consistent"], true, "counters drifted: {body:#}");
    }

    /// Returns once `request` is held: a session whose statement contains `statement` waits
    /// for an advisory lock. Panics, saying `what` did not happen, if `request` finishes first or
    /// nothing waits within ten seconds.
    pub async fn await_held_on_advisory_lock<F: Future + Unpin>(
        &self,
        request: &mut F,
        statement: &str,
        what: &str,
    ) {
        let waiting = "SELECT count(*)
                         FROM pg_locks l
                         JOIN pg_stat_activity a USING (pid)
                        WHERE l.locktype = 'advisory'
                          AND NOT l.granted
                          AND strpos(a.query, $1) > 0";
        let held = async {
            while self.db.query_one(waiting, &[&statement]).await.expect("locks").get::<_, i64>(0)
                == 0
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            _ = request => panic!("{what}: the request finished first"),
            held = tokio::time::timeout(Duration::from_secs(10), held) => {
                held.unwrap_or_else(|_| panic!("{what}: nothing waited"));
            }
        }
    }

    /// Waits until `count` workers of `service` are long-polling this broker.
    pub async fn await_waiting_workers(&self, service: &str, count: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let body: Value = self.get("/admin/waiting-workers").await.json().await.expect("JSON");
            if body["services"][service].as_u64().unwrap_or(0) >= count {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "workers never started waiting: {body}");
            tokio::task::yield_now().await;
        }
    }

    /// Waits until the reaper has retired every tenant queue with nothing ready (it does so
    /// every --reap-interval), so that it does not happen between two fingerprints.
    pub async fn await_idle_tenant_queues_retired(&self) {
        let retired = "SELECT coalesce(NOT bool_or(active), true) FROM tenant_queues";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.db.query_one(retired, &[]).await.expect("queue").get::<_, bool>(0) {
            assert!(std::time::Instant::now() < deadline, "an idle tenant queue was never retired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A digest of every row of every table, to show that a request changed nothing.
    pub async fn fingerprint(&self) -> String {
        self.digest("t").await
    }

    /// `fingerprint`, blind to the tenant rows' running counts only: a tenant alone in its
    /// component keeps that count as a hint, which the reaper recounts in the background and
    /// may briefly write stale (see tenant_queues in the schema). Tests with the reaper at work compare
    /// everything else.
    pub async fn fingerprint_apart_from_tenant_hints(&self) -> String {
        self.digest("(t.service, t.component, t.tenant, t.active, t.last_worked)").await
    }

    /// Digests each table's rows, tenant_queues' as `tenant_queue_row` renders them.
    async fn digest(&self, tenant_queue_row: &str) -> String {
        let mut digest = String::new();
        let tables = [
            "users",
            "tenants",
            "jobs",
            "job_steps",
            "user_work",
            "service_users",
            "tenant_queues",
            "work_items",
            "queriers",
            "tenant_shards",
            "idempotency_keys",
        ];
        for table in tables {
            let row = if table == "tenant_queues" { tenant_queue_row } else { "t" };
            let sql = format!(
                "SELECT coalesce(md5(string_agg(({row})::text, '|' ORDER BY ({row})::text)), '') \
                 FROM {table} t"
            );
            let row = self.db.query_one(&sql, &[]).await.expect("fingerprint");
            digest.push_str(&row.get::<_, String>(0));
        }
        digest
    }
}
