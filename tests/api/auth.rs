//! Authentication and authorization (docs/security.md): every route × every role × in and
//! out of scope, from one table; a worker's reports on another token's items; revocation,
//! expiry, storage as hashes, the 401 challenge, the refused open bind and the CLI.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fairway_server::config::{AuthArgs, ServeArgs};
use fairway_server::startup::{Application, StartupError};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::helpers::{
    auth_args, connect, empty_database, fresh_database, spawn_app, spawn_app_with,
    spawn_app_with_auth, spawn_broker, TestApp, ADMIN_TOKEN,
};

/// Who a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Admin,
    Reader,
    /// Scoped to tenant `acme`.
    Producer,
    /// Scoped to service `svc-a`.
    Worker,
}

const EVERYONE: [Who; 4] = [Who::Admin, Who::Reader, Who::Producer, Who::Worker];

/// What the out-of-scope variant of a route's request reaches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// No scope applies: in and out are the same request.
    None,
    /// A producer's tenants; out of scope is 403 (naming the tenant)...
    TenantNamed,
    /// ...or 404 (another tenant's job, as if it did not exist).
    TenantsJob,
    /// A worker's services: out of scope is 403.
    Service,
    /// A worker's own claims: another token's item is 403.
    OwnItem,
}

/// One row per route: its method and pattern as the OpenAPI document names them, the roles
/// that may call it ("open": anyone, without a token), and its scope.
const ROUTES: &[(&str, &str, &str, Scope)] = &[
    ("POST", "/jobs", "admin producer", Scope::TenantNamed),
    ("GET", "/jobs", "admin reader producer", Scope::TenantNamed),
    ("GET", "/jobs/{job_id}", "admin reader producer", Scope::TenantsJob),
    ("POST", "/jobs/{job_id}/items", "admin producer", Scope::TenantsJob),
    ("GET", "/jobs/{job_id}/items", "admin reader producer", Scope::TenantsJob),
    ("GET", "/jobs/{job_id}/results", "admin reader producer", Scope::TenantsJob),
    ("POST", "/jobs/{job_id}/retry", "admin producer", Scope::TenantsJob),
    ("POST", "/jobs/{job_id}/{action}", "admin producer", Scope::TenantsJob),
    ("GET", "/work", "admin worker", Scope::Service),
    ("POST", "/work/{id}/status", "admin worker", Scope::OwnItem),
    ("POST", "/queriers/{querier}/shutdown", "admin worker", Scope::None),
    ("GET", "/admin/user-work", "admin reader", Scope::None),
    ("GET", "/admin/shares", "admin reader", Scope::None),
    ("GET", "/admin/services", "admin reader", Scope::None),
    ("GET", "/admin/version", "admin reader", Scope::None),
    ("GET", "/admin/services/{service}", "admin reader", Scope::None),
    ("PUT", "/admin/services/{service}", "admin", Scope::None),
    ("GET", "/admin/consistency", "admin reader", Scope::None),
    ("GET", "/admin/strategies/usage", "admin reader", Scope::None),
    ("GET", "/admin/waiting-workers", "admin reader", Scope::None),
    ("GET", "/admin/queriers", "admin reader", Scope::None),
    ("GET", "/admin/users/{user}", "admin reader", Scope::None),
    ("PUT", "/admin/users/{user}", "admin", Scope::None),
    ("GET", "/admin/tenants", "admin reader", Scope::None),
    ("GET", "/admin/tenants/{tenant}", "admin reader", Scope::None),
    ("PUT", "/admin/tenants/{tenant}", "admin", Scope::None),
    ("POST", "/admin/jobs/{action}", "admin producer", Scope::TenantNamed),
    ("GET", "/admin/tokens", "admin", Scope::None),
    ("POST", "/admin/tokens", "admin", Scope::None),
    ("POST", "/admin/tokens/{id}/revoke", "admin", Scope::None),
    ("GET", "/metrics", "open", Scope::None),
    ("GET", "/healthz", "open", Scope::None),
    ("GET", "/readyz", "open", Scope::None),
    ("GET", "/prestop", "open", Scope::None),
];

fn role_name(who: Who) -> &'static str {
    match who {
        Who::Admin => "admin",
        Who::Reader => "reader",
        Who::Producer => "producer",
        Who::Worker => "worker",
    }
}

/// The broker, its tokens, and jobs in scope (tenant acme, service svc-a) and out of it
/// (tenant globex; service svc-b).
struct World {
    app: TestApp,
    reader: String,
    producer: String,
    worker: String,
    /// An unscoped worker: the "other token" whose items the scoped worker may not report on.
    other_worker: String,
    acme_job: Uuid,
    globex_job: Uuid,
}

impl World {
    async fn new() -> Self {
        // The reaper once, at start: it would retire the queriers the matrix shuts down while
        // a refused request's before and after are read.
        let args = ServeArgs { reap_interval: Duration::from_secs(3600), ..auth_args() };
        let app = spawn_app_with(args).await;
        let reader = make_token(&app, json!({ "role": "reader" })).await;
        let producer = make_token(&app, json!({ "role": "producer", "tenants": ["acme"] })).await;
        let worker = make_token(&app, json!({ "role": "worker", "services": ["svc-a"] })).await;
        let other_worker = make_token(&app, json!({ "role": "worker" })).await;
        let acme_job = app.submit(job("acme", "svc-a", 200)).await;
        let globex_job = app.submit(job("globex", "svc-a", 200)).await;
        app.submit(job("globex", "svc-b", 5)).await;
        Self { app, reader, producer, worker, other_worker, acme_job, globex_job }
    }

    fn token(&self, who: Who) -> &str {
        match who {
            Who::Admin => ADMIN_TOKEN,
            Who::Reader => &self.reader,
            Who::Producer => &self.producer,
            Who::Worker => &self.worker,
        }
    }

    async fn send(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::Response {
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.app.http.request(method, self.app.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.expect("send")
    }

    /// An item of svc-a claimed with `token`, running.
    async fn claimed_by(&self, token: &str, querier: &str) -> Value {
        let path = format!("/work?service=svc-a&querier={querier}");
        let response = self.send(Some(token), "GET", &path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "claim with a worker token");
        let body: Value = response.json().await.expect("JSON");
        body["work_items"][0].clone()
    }

    /// A new job of `tenant` whose only item failed for good, on a service of its own so that
    /// no other job's item is claimed in its place.
    async fn failed_job(&self, tenant: &str) -> Uuid {
        let service = format!("svc-r-{}", Uuid::new_v4().simple());
        let job = self.app.submit(job(tenant, &service, 1)).await;
        let path = format!("/work?service={service}&querier=pod-retry");
        let response = self.send(Some(ADMIN_TOKEN), "GET", &path, None).await;
        let body: Value = response.json().await.expect("JSON");
        let item = &body["work_items"][0];
        let failure = json!({ "status": "failed", "attempt": item["attempt"], "retryable": false });
        let status = format!("/work/{}/status", item["id"]);
        let response = self.send(Some(ADMIN_TOKEN), "POST", &status, Some(&failure)).await;
        assert_eq!(response.status(), StatusCode::OK, "fail the item");
        job
    }

    /// The concrete request for a route, in scope or out of it, as `who` would send it.
    async fn request(&self, route: &str, method: &str, out: bool, who: Who) -> (String, Value) {
        let (tenant, job) = if out { ("globex", self.globex_job) } else { ("acme", self.acme_job) };
        let nothing = Value::Null;
        match (method, route) {
            ("POST", "/jobs") => ("/jobs".into(), job_body(tenant, "svc-a", 1)),
            ("GET", "/jobs") => (format!("/jobs?tenant={tenant}"), nothing),
            ("GET", "/jobs/{job_id}") => (format!("/jobs/{job}"), nothing),
            ("POST", "/jobs/{job_id}/items") => {
                (format!("/jobs/{job}/items"), json!({ "items": [{ "payload": 1 }] }))
            }
            ("GET", "/jobs/{job_id}/items") => (format!("/jobs/{job}/items?limit=2"), nothing),
            ("GET", "/jobs/{job_id}/results") => (format!("/jobs/{job}/results"), nothing),
            ("POST", "/jobs/{job_id}/{action}") => (format!("/jobs/{job}/resume"), nothing),
            ("POST", "/jobs/{job_id}/retry") => {
                (format!("/jobs/{}/retry", self.failed_job(tenant).await), nothing)
            }
            ("GET", "/work") => {
                let service = if out { "svc-b" } else { "svc-a" };
                (format!("/work?service={service}&querier=pod-{}", role_name(who)), nothing)
            }
            ("POST", "/work/{id}/status") => {
                // In scope: an item this token claimed (an admin's own too); out: another
                // worker token's. A role that may not report gets any running item.
                let claimer = match (who, out) {
                    (_, true) => self.other_worker.clone(),
                    (Who::Worker, false) => self.worker.clone(),
                    _ => self.other_worker.clone(),
                };
                let item = self.claimed_by(&claimer, "pod-claims").await;
                let body = json!({ "status": "running", "attempt": item["attempt"] });
                (format!("/work/{}/status", item["id"]), body)
            }
            ("POST", "/queriers/{querier}/shutdown") => {
                // A querier is known once it asked for work; an unknown one is not found.
                let querier = format!("leaving-{}", role_name(who));
                let path = format!("/work?service=svc-none&querier={querier}");
                let response = self.send(Some(ADMIN_TOKEN), "GET", &path, None).await;
                let status = response.status();
                assert!(status.is_success() || status == StatusCode::GONE, "{querier}: {status}");
                (format!("/queriers/{querier}/shutdown"), nothing)
            }
            ("GET", "/admin/user-work") => ("/admin/user-work".into(), nothing),
            ("GET", "/admin/shares") => ("/admin/shares?service=svc-a".into(), nothing),
            ("GET", "/admin/strategies/usage") => {
                ("/admin/strategies/usage?service=svc-a&key=customer".into(), nothing)
            }
            ("GET", "/admin/services/{service}") => ("/admin/services/svc-a".into(), nothing),
            // A policy that lifts nothing: no claim of the world changes under it.
            ("PUT", "/admin/services/{service}") => {
                ("/admin/services/svc-policy".into(), json!({ "max_running": 0 }))
            }
            ("GET", "/admin/users/{user}") => ("/admin/users/acme-user".into(), nothing),
            // A weight of 1 for a user with no work: no claim of the world changes under it.
            ("PUT", "/admin/users/{user}") => {
                ("/admin/users/policy-user".into(), json!({ "weight": 1 }))
            }
            ("GET", "/admin/tenants/{tenant}") => ("/admin/tenants/default".into(), nothing),
            ("PUT", "/admin/tenants/{tenant}") => {
                ("/admin/tenants/acme".into(), json!({ "max_queriers": 0, "max_outstanding": 0 }))
            }
            ("POST", "/admin/tokens") => ("/admin/tokens".into(), json!({ "role": "reader" })),
            // Resume, which leaves the world's unpaused jobs as they are.
            ("POST", "/admin/jobs/{action}") => {
                ("/admin/jobs/resume".into(), json!({ "tenant": tenant }))
            }
            ("POST", "/admin/tokens/{id}/revoke") => {
                let spare = make_token_document(&self.app, json!({ "role": "reader" })).await;
                (format!("/admin/tokens/{}/revoke", spare["details"]["id"]), nothing)
            }
            (_, path) => {
                assert!(!path.contains('{'), "no request written for {method} {route}");
                (path.to_owned(), nothing)
            }
        }
    }
}

fn job_body(tenant: &str, service: &str, items: usize) -> Value {
    let items: Vec<Value> = (0..items).map(|n| json!({ "payload": { "n": n } })).collect();
    json!({ "user": format!("{tenant}-user"), "tenant": tenant,
            "steps": [{ "service": service }], "items": items })
}

fn job(tenant: &str, service: &str, items: usize) -> Value {
    job_body(tenant, service, items)
}

/// Makes a token with the app's admin token; returns the answer.
async fn make_token_document(app: &TestApp, body: Value) -> Value {
    let response = app.post("/admin/tokens", &body).await;
    assert_eq!(response.status(), StatusCode::CREATED, "make a token {body}");
    response.json().await.expect("JSON")
}

async fn make_token(app: &TestApp, body: Value) -> String {
    let made = make_token_document(app, body).await;
    made["token"].as_str().expect("the token").to_owned()
}

/// What a role's request should get.
fn expected(row: &(&str, &str, &str, Scope), who: Who, out: bool) -> Option<StatusCode> {
    let (_, _, roles, scope) = *row;
    if roles == "open" {
        return None; // any 2xx
    }
    if !roles.split(' ').any(|role| role == role_name(who)) {
        return Some(StatusCode::FORBIDDEN);
    }
    match (scope, who, out) {
        (Scope::TenantNamed, Who::Producer, true) => Some(StatusCode::FORBIDDEN),
        (Scope::TenantsJob, Who::Producer, true) => Some(StatusCode::NOT_FOUND),
        (Scope::Service, Who::Worker, true) => Some(StatusCode::FORBIDDEN),
        (Scope::OwnItem, Who::Worker, true) => Some(StatusCode::FORBIDDEN),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_role_in_and_out_of_scope_as_the_table_says() {
    let world = World::new().await;
    for row in ROUTES {
        let (method, route, roles, scope) = *row;
        for who in EVERYONE {
            for out in [false, true] {
                if out && scope == Scope::None {
                    continue;
                }
                let (path, body) = world.request(route, method, out, who).await;
                let body = (!body.is_null()).then_some(&body);
                let before = world.app.fingerprint_apart_from_tenant_hints().await;
                let response = world.send(Some(world.token(who)), method, &path, body).await;
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                let case = format!(
                    "{method} {path} as {} ({})",
                    role_name(who),
                    if out { "out of scope" } else { "in scope" }
                );
                match expected(row, who, out) {
                    None => assert!(status.is_success(), "{case}: {status} {text}"),
                    Some(refused) => {
                        assert_eq!(status, refused, "{case}: {text}");
                        let error: Value = serde_json::from_str(&text).expect("a JSON error");
                        assert!(error["error"]["code"].is_string(), "{case}: {text}");
                        assert_eq!(
                            world.app.fingerprint_apart_from_tenant_hints().await,
                            before,
                            "{case} changed something"
                        );
                    }
                }
            }
        }
        // Without a token, or with one that is not a token: 401 with the challenge, unless open.
        for token in [None, Some("fw_not-a-token")] {
            let (path, body) = world.request(route, method, false, Who::Admin).await;
            let body = (!body.is_null()).then_some(&body);
            let before = world.app.fingerprint_apart_from_tenant_hints().await;
            let response = world.send(token, method, &path, body).await;
            if roles == "open" {
                assert!(response.status().is_success(), "{method} {path} is open");
                continue;
            }
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{method} {path} {token:?}");
            let challenge = response.headers().get("www-authenticate").expect("WWW-Authenticate");
            assert!(challenge.to_str().expect("text").starts_with("Bearer"), "{challenge:?}");
            let error: Value = response.json().await.expect("a JSON error");
            let code = if token.is_none() { "missing_token" } else { "invalid_token" };
            assert_eq!(error["error"]["code"], code);
            assert_eq!(
                world.app.fingerprint_apart_from_tenant_hints().await,
                before,
                "{method} {path} changed something"
            );
        }
    }
    world.app.assert_consistent().await;
}

#[tokio::test]
async fn the_table_has_a_row_for_every_route_of_the_openapi_document() {
    let app = spawn_app().await;
    let document: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_some() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let tabled: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path, _, _)| ((*method).to_owned(), (*path).to_owned()))
        .collect();
    let missing: Vec<_> = documented.difference(&tabled).collect();
    assert!(missing.is_empty(), "routes without a row in tests/api/auth.rs's ROUTES: {missing:?}");
    let stale: Vec<_> = tabled.difference(&documented).collect();
    assert!(stale.is_empty(), "rows for routes the API does not have: {stale:?}");
    // The broker's own table agrees with this one on who may call what.
    for (method, path, roles, _) in ROUTES {
        let method = actix_web::http::Method::from_bytes(method.as_bytes()).expect("method");
        let access = fairway_server::auth::access(&method, Some(path), false);
        let expected = match *roles {
            "open" => "open".to_owned(),
            roles => roles.to_owned(),
        };
        let actual = match access {
            fairway_server::auth::Access::Open => "open".to_owned(),
            fairway_server::auth::Access::Roles(roles) => {
                let mut names: Vec<&str> = roles.iter().map(|role| role.as_str()).collect();
                let order = ["admin", "reader", "producer", "worker"];
                names.sort_by_key(|name| order.iter().position(|o| o == name));
                names.join(" ")
            }
        };
        assert_eq!(actual, expected, "{method} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_report_on_another_tokens_item_at_any_broker() {
    let first = spawn_app_with_auth().await;
    let second = spawn_broker(auth_args(), first.config.clone()).await;
    let mine = make_token(&first, json!({ "role": "worker" })).await;
    let theirs = make_token(&first, json!({ "role": "worker" })).await;
    first.submit(job("acme", "svc", 2)).await;
    let claim = |token: String| {
        let http = first.http.clone();
        let url = first.url("/work?service=svc&querier=pod-1");
        async move {
            let response = http.get(url).bearer_auth(token).send().await.expect("claim");
            assert_eq!(response.status(), StatusCode::OK);
            response.json::<Value>().await.expect("JSON")["work_items"][0].clone()
        }
    };
    let item = claim(theirs.clone()).await;
    let status = format!("/work/{}/status", item["id"]);
    let attempt = &item["attempt"];
    let before = first.fingerprint_apart_from_tenant_hints().await;
    for app in [&first, &second] {
        for body in [
            json!({ "status": "successful", "attempt": attempt, "results": [] }),
            json!({ "status": "running", "attempt": attempt }),
            json!({ "status": "failed", "attempt": attempt, "error": "no", "retryable": false }),
        ] {
            let response = app
                .http
                .post(app.url(&status))
                .bearer_auth(&mine)
                .json(&body)
                .send()
                .await
                .expect("report");
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{body}");
            let error: Value = response.json().await.expect("JSON");
            assert_eq!(error["error"]["code"], "not_your_item");
        }
    }
    assert_eq!(
        first.fingerprint_apart_from_tenant_hints().await,
        before,
        "a refused report changed something"
    );
    // Its own token may report, at the other broker.
    let done = json!({ "status": "successful", "attempt": attempt, "results": [] });
    let response = second
        .http
        .post(second.url(&status))
        .bearer_auth(&theirs)
        .json(&done)
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    // Sent again (its answer lost), with its own token: the same answer, at either broker.
    // The same update with another token is not a repeat: it is refused.
    for app in [&first, &second] {
        let send = |token: &str| app.http.post(app.url(&status)).bearer_auth(token).json(&done);
        let response = send(&theirs).send().await.expect("report");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.json::<Value>().await.expect("JSON"), answer);
        let response = send(&mine).send().await.expect("report");
        assert_eq!(response.status(), StatusCode::CONFLICT);
    }
    first.assert_consistent().await;
}

/// Polls `check` until it holds, for at most `limit`; returns how long it took.
async fn await_true<F, Fut>(limit: Duration, what: &str, check: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what} did not happen within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_by_every_broker_within_seconds() {
    let first = spawn_app_with_auth().await;
    let second = spawn_broker(auth_args(), first.config.clone()).await;
    let made = make_token_document(&first, json!({ "role": "reader", "name": "dashboard" })).await;
    let token = made["token"].as_str().expect("token").to_owned();
    let read = |app: &TestApp| app.http.get(app.url("/admin/services")).bearer_auth(&token).send();
    // Both brokers have it cached.
    assert_eq!(read(&first).await.expect("GET").status(), StatusCode::OK);
    assert_eq!(read(&second).await.expect("GET").status(), StatusCode::OK);
    let id = &made["details"]["id"];
    let response = first.post(&format!("/admin/tokens/{id}/revoke"), &json!(null)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let revoked: Value = response.json().await.expect("JSON");
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    // The broker that revoked it refuses it at once; the other within its cache's TTL (1 s).
    let response = read(&first).await.expect("GET");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "token_revoked");
    let took = await_true(Duration::from_secs(10), "revocation at the second broker", || async {
        read(&second).await.expect("GET").status() == StatusCode::UNAUTHORIZED
    })
    .await;
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test]
async fn an_expired_token_gets_401() {
    let app = spawn_app_with_auth().await;
    let token = make_token(&app, json!({ "role": "reader", "expires_in_seconds": 1 })).await;
    let read = || app.http.get(app.url("/admin/tenants")).bearer_auth(&token).send();
    assert_eq!(read().await.expect("GET").status(), StatusCode::OK);
    await_true(Duration::from_secs(10), "expiry", || async {
        read().await.expect("GET").status() == StatusCode::UNAUTHORIZED
    })
    .await;
    let response = read().await.expect("GET");
    assert!(response.headers().contains_key("www-authenticate"));
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "token_expired");
}

#[tokio::test]
async fn tokens_are_stored_only_as_their_sha256() {
    let app = spawn_app_with_auth().await;
    let token = make_token(&app, json!({ "role": "producer", "tenants": ["acme"] })).await;
    assert!(token.starts_with("fw_") && token.len() == 67, "{token}");
    let rows =
        app.db.query("SELECT to_jsonb(t)::text, hash FROM tokens t", &[]).await.expect("tokens");
    assert_eq!(rows.len(), 2, "the bootstrap admin and the producer");
    let mut hashes = Vec::new();
    for row in &rows {
        let text: String = row.get(0);
        assert!(
            !text.contains(&token[3..]) && !text.contains(ADMIN_TOKEN),
            "a secret is stored: {text}"
        );
        hashes.push(row.get::<_, Vec<u8>>(1));
    }
    for secret in [token.as_str(), ADMIN_TOKEN] {
        let digest = Sha256::digest(secret.as_bytes()).to_vec();
        assert!(hashes.contains(&digest), "no row holds the SHA-256 of a token");
    }
    // The listing shows neither.
    let listed = app.get("/admin/tokens").await.text().await.expect("text");
    assert!(!listed.contains(&token[3..]) && !listed.contains(ADMIN_TOKEN), "{listed}");
    assert!(!listed.contains("hash"), "{listed}");
}

/// A broker on every address, with `auth`.
fn wide(auth: AuthArgs) -> ServeArgs {
    ServeArgs { bind: "0.0.0.0:0".parse().expect("address"), auth, ..ServeArgs::for_tests() }
}

#[tokio::test]
async fn a_non_loopback_bind_needs_auth_or_insecure_no_auth() {
    let refused = Application::build(&wide(AuthArgs::default()), fresh_database().await).await;
    assert!(matches!(refused, Err(StartupError::NoAuth { .. })), "{:?}", refused.err());
    let insecure = AuthArgs { insecure_no_auth: true, ..AuthArgs::default() };
    assert!(Application::build(&wide(insecure), fresh_database().await).await.is_ok());
    let with_token = AuthArgs { admin_token: Some(ADMIN_TOKEN.to_owned()), ..AuthArgs::default() };
    assert!(Application::build(&wide(with_token), fresh_database().await).await.is_ok());
    // A token too short to be a secret is refused.
    let weak = AuthArgs { admin_token: Some("hunter2".to_owned()), ..AuthArgs::default() };
    let refused = Application::build(&wide(weak), fresh_database().await).await;
    assert!(matches!(refused, Err(StartupError::AdminToken(_))), "{:?}", refused.err());
}

#[tokio::test]
async fn a_refused_start_leaves_an_empty_database_empty() {
    let weak = AuthArgs { admin_token: Some("hunter2".to_owned()), ..AuthArgs::default() };
    for auth in [AuthArgs::default(), weak] {
        let database = empty_database().await;
        let refused = Application::build(&wide(auth), database.clone()).await;
        assert!(refused.is_err(), "the start is refused");
        let relations: i64 = connect(&database)
            .await
            .query_one(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(relations, 0, "{:?} left the database changed", refused.err());
    }

    // A token the database holds turns auth on: read before the migrations, it lets the start go.
    let app = spawn_app().await;
    make_token_document(&app, json!({ "role": "admin" })).await;
    assert!(Application::build(&wide(AuthArgs::default()), app.config.clone()).await.is_ok());
}

#[tokio::test]
async fn the_first_token_turns_auth_on_for_every_broker() {
    // No token: loopback, auth off, everything answers without one.
    let args = || ServeArgs {
        auth: AuthArgs { auth_cache_ttl: Duration::from_millis(200), ..AuthArgs::default() },
        ..ServeArgs::for_tests()
    };
    let first = spawn_app_with(args()).await;
    let second = spawn_broker(args(), first.config.clone()).await;
    for app in [&first, &second] {
        assert_eq!(app.get("/admin/tenants").await.status(), StatusCode::OK);
    }
    // The broker that made it at once, the other within its refresh.
    let made = make_token_document(&first, json!({ "role": "admin" })).await;
    assert_eq!(first.get("/admin/tenants").await.status(), StatusCode::UNAUTHORIZED);
    await_true(Duration::from_secs(10), "auth turning on at the other broker", || async {
        second.get("/admin/tenants").await.status() == StatusCode::UNAUTHORIZED
    })
    .await;
    let token = made["token"].as_str().expect("token");
    for app in [&first, &second] {
        let response =
            app.http.get(app.url("/admin/tenants")).bearer_auth(token).send().await.expect("GET");
        assert_eq!(response.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn metrics_can_require_a_token() {
    let mut args = auth_args();
    args.auth.metrics_require_token = true;
    let app = spawn_app_with(args).await;
    let open = app.http.get(app.url("/metrics")).send().await.expect("GET");
    assert_eq!(open.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(app.get("/metrics").await.status(), StatusCode::OK);
    let worker = make_token(&app, json!({ "role": "worker" })).await;
    let response =
        app.http.get(app.url("/metrics")).bearer_auth(&worker).send().await.expect("GET");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    for probe in ["/healthz", "/readyz"] {
        let response = app.http.get(app.url(probe)).send().await.expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "{probe} stays open");
    }
}

#[tokio::test]
async fn a_producer_scoped_to_several_tenants_lists_one_named_tenant() {
    let app = spawn_app_with_auth().await;
    let token =
        make_token(&app, json!({ "role": "producer", "tenants": ["acme", "initech"] })).await;
    let get = |path: &str| app.http.get(app.url(path)).bearer_auth(&token).send();
    app.submit(job("initech", "svc", 1)).await;
    let listed: Value = get("/jobs?tenant=initech").await.expect("GET").json().await.expect("JSON");
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(get("/jobs?user=initech-user").await.expect("GET").status(), StatusCode::FORBIDDEN);
    assert_eq!(get("/jobs?tenant=globex").await.expect("GET").status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_cli_makes_lists_and_revokes_tokens() {
    let app = spawn_app_with_auth().await;
    let fairway = |args: &[&str], token: Option<&str>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
        command.env("FAIRWAY_URL", &app.address).env_remove("FAIRWAY_TOKEN").args(args);
        if let Some(token) = token {
            command.env("FAIRWAY_TOKEN", token);
        }
        command.output()
    };
    let output = fairway(
        &[
            "admin",
            "tokens",
            "create",
            "--role",
            "producer",
            "--tenant",
            "acme",
            "--name",
            "ci",
            "--expires",
            "90d",
        ],
        Some(ADMIN_TOKEN),
    )
    .await
    .expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let token = stdout.lines().last().expect("a last line").to_owned();
    assert!(
        token.starts_with("fw_") && token.len() == 67,
        "the token alone on the last line: {stdout}"
    );

    // The new token works, in its scope.
    let response = app
        .http
        .post(app.url("/jobs"))
        .bearer_auth(&token)
        .json(&job("acme", "svc", 1))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::CREATED);

    // --token works as FAIRWAY_TOKEN does; the listing names it, never a secret.
    let output =
        fairway(&["admin", "--token", ADMIN_TOKEN, "tokens", "list"], None).await.expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let listing = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(
        listing.contains("ci") && listing.contains("producer") && listing.contains("acme"),
        "{listing}"
    );
    assert!(!listing.contains(&token[3..]) && !listing.contains(ADMIN_TOKEN), "{listing}");

    // Without a token the CLI is refused, and says so.
    let output = fairway(&["admin", "tokens", "list"], None).await.expect("run");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output =
        fairway(&["admin", "tokens", "revoke", "ci"], Some(ADMIN_TOKEN)).await.expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let response = app
        .http
        .post(app.url("/jobs"))
        .bearer_auth(&token)
        .json(&job("acme", "svc", 1))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let output =
        fairway(&["admin", "--json", "tokens", "list"], Some(ADMIN_TOKEN)).await.expect("run");
    let listed: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let ci = listed
        .as_array()
        .expect("list")
        .iter()
        .find(|token| token["name"] == "ci")
        .cloned()
        .expect("ci");
    assert!(ci["revoked_at"].is_string() && ci["expires_at"].is_string(), "{ci}");
}

#[tokio::test]
async fn the_api_docs_are_one_contract_whatever_the_auth_state() {
    let app = spawn_app().await;
    let before: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    // The first token turns auth on while the broker runs.
    let created = app.post("/admin/tokens", &json!({"name": "ops", "role": "admin"})).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let after: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    assert_eq!(before, after, "turning auth on changed the served contract");
    let on = spawn_app_with(auth_args()).await;
    let from_the_start: Value = on.get("/openapi.json").await.json().await.expect("JSON");
    assert_eq!(before, from_the_start);

    assert!(before["components"]["securitySchemes"]["bearer"].is_object(), "{before}");
    let guarded = &before["paths"]["/jobs"]["post"];
    assert_eq!(guarded["security"], json!([{"bearer": []}]));
    for status in ["401", "403"] {
        assert!(guarded["responses"][status].is_object(), "POST /jobs documents {status}");
    }
    // /metrics needs a token only with --metrics-require-token.
    let metrics = &before["paths"]["/metrics"]["get"];
    assert_eq!(metrics["security"], json!([{"bearer": []}, {}]));
    assert!(metrics["responses"]["401"].is_object());
    let probe = &before["paths"]["/healthz"]["get"];
    assert!(probe.get("security").is_none() && probe["responses"].get("401").is_none());
    assert!(before["info"]["description"].as_str().is_some_and(|d| d.contains("/ui/")));
}
