//! A typed client of fairway's HTTP API, for Rust workers and tools. The `fairway admin`,
//! `fairway submit` and `fairway worker` commands are built on it, and it decodes the same
//! documents the broker serves.

pub mod args;
pub mod cli;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use fairway_api::build::VersionDocument;
use fairway_api::model::{
    ItemStatus, JobDocument, JobId, Mismatch, UserShare, UserWorkRow, WorkItem,
};
use fairway_api::policy::{PolicyChange, ServicePolicyDocument, UserPolicyDocument};
use fairway_api::summary::ServiceSummary;
use fairway_api::tenancy::{QuerierDocument, TenantChange, TenantDocument};
use fairway_api::tokens::TokenDocument;

#[derive(Debug, Error)]
pub enum ClientError {
    /// The broker answered with its JSON error, and with how long to wait before asking again
    /// when it said (Retry-After, on a 503 or 429).
    #[error("{message} ({status}, {code})")]
    Api { status: StatusCode, code: String, message: String, retry_after: Option<Duration> },
    /// The broker could not be reached, or its answer could not be read.
    #[error("{}", transport_message(.0))]
    Transport(#[from] reqwest::Error),
    /// The broker answered something that is not the documented document.
    #[error("unexpected answer from the broker ({status}): {body}")]
    Unexpected { status: StatusCode, body: String },
    /// The CA certificates to trust could not be read.
    #[error("cannot use --ca-cert {}: {reason}", path.display())]
    CaCert { path: PathBuf, reason: String },
    /// A broker's address is not an http:// or https:// URL.
    #[error(
        "{0:?} is not an http:// or https:// URL of a broker, nor a comma-separated list of them"
    )]
    Url(String),
}

/// A transport error in words that say what to check: reqwest's own ("error sending request
/// for url (…)") hide the cause in its source chain.
fn transport_message(error: &reqwest::Error) -> String {
    let url = error.url().map(|url| {
        let mut base = url.clone();
        base.set_path("");
        base.set_query(None);
        base.as_str().trim_end_matches('/').to_owned()
    });
    let url = url.as_deref().unwrap_or("the broker's URL");
    let causes = causes(error);
    let innermost = causes.last().cloned().unwrap_or_default();
    if error.is_connect() && innermost.contains("Connection refused") {
        return format!("connection refused: is a broker running at {url}? (--url, FAIRWAY_URL)");
    }
    if is_untrusted_certificate(error) {
        return format!(
            "the certificate of {url} is not trusted ({innermost}): trust the CA that signed \
             it with --ca-cert or FAIRWAY_CA_CERT"
        );
    }
    if error.is_connect() {
        return format!("cannot connect to {url}: {innermost} (--url, FAIRWAY_URL)");
    }
    if error.is_timeout() {
        return format!("no answer from {url} within {}s", REQUEST_TIMEOUT.as_secs());
    }
    std::iter::once(error.to_string()).chain(causes).collect::<Vec<_>>().join(": ")
}

fn causes(error: &reqwest::Error) -> Vec<String> {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    causes
}

/// Whether the TLS handshake refused the broker's certificate: no retry will change that.
fn is_untrusted_certificate(error: &reqwest::Error) -> bool {
    error.is_connect() && causes(error).iter().any(|cause| cause.contains("certificate"))
}

impl ClientError {
    /// Whether asking again later may succeed: the broker or its database was unavailable, or
    /// the broker asked for fewer requests (429).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Api { status, .. } | Self::Unexpected { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            Self::Transport(_) => !self.is_untrusted_certificate(),
            Self::CaCert { .. } | Self::Url(_) => false,
        }
    }

    /// How long the broker asked to be left alone, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the broker's certificate was refused: asking again cannot help until the
    /// client is told which CA to trust.
    pub fn is_untrusted_certificate(&self) -> bool {
        matches!(self, Self::Transport(error) if is_untrusted_certificate(error))
    }
}

/// The brokers' addresses and the HTTP client that talks to them. Cheap to clone: clones share
/// which broker answered last.
#[derive(Debug, Clone)]
pub struct Client {
    brokers: Arc<Brokers>,
    token: Option<String>,
    http: reqwest::Client,
}

/// The brokers a client may send to, in the order given, and the one it sends to now: the
/// last that answered. A request that finds its broker away (a refused connection, or a 503,
/// which changes nothing) goes on to the next, so a client given several brokers keeps
/// working while one of them stops, restarts or drains.
#[derive(Debug)]
struct Brokers {
    bases: Vec<reqwest::Url>,
    current: AtomicUsize,
}

impl Brokers {
    /// Parses a comma-separated list of base URLs.
    fn parse(list: &str) -> Result<Self, ClientError> {
        let bases = list
            .split(',')
            .map(str::trim)
            .filter(|base| !base.is_empty())
            .map(|base| {
                let url = reqwest::Url::parse(base.trim_end_matches('/'))
                    .ok()
                    .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
                    .ok_or_else(|| ClientError::Url(base.to_owned()))?;
                Ok(url)
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        if bases.is_empty() {
            return Err(ClientError::Url(list.to_owned()));
        }
        Ok(Self { bases, current: AtomicUsize::new(0) })
    }

    /// `url` moved to the broker at `index`, keeping its path and query.
    /// A request's URL, built against the first broker (see [`Client::request`]), moved to the
    /// broker at `index`: its path below the base's path, and its query, kept.
    fn at(&self, index: usize, url: &reqwest::Url) -> reqwest::Url {
        let first = self.bases[0].path().trim_end_matches('/');
        let below = url.path().strip_prefix(first).unwrap_or(url.path());
        let mut moved = self.bases[index].clone();
        let base_path = moved.path().trim_end_matches('/').to_owned();
        moved.set_path(&format!("{base_path}{below}"));
        moved.set_query(url.query());
        moved
    }
}

/// What a worker asks for.
#[derive(Debug, Clone)]
pub struct ClaimParams<'a> {
    pub service: &'a str,
    pub querier: &'a str,
    /// The worker slot within the querier (0–1023).
    pub worker: u32,
    /// Most items to take (1–100).
    pub max: u32,
    /// How long to wait for work to appear (0–60 s).
    pub wait: Duration,
}

/// The header on an empty claim's answer when no job has named the service.
const UNKNOWN_SERVICE: &str = "fairway-unknown-service";

/// What a claim got.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub items: Vec<WorkItem>,
    /// No item, and no job has named the service: possibly a typo, possibly early.
    pub unknown_service: bool,
}

/// A worker's report on the attempt it holds.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Report {
    /// Still working: extends the lease.
    Running {
        attempt: i32,
    },
    Successful {
        attempt: i32,
        results: Vec<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        component: Option<String>,
    },
    Failed {
        attempt: i32,
        error: Option<String>,
        retryable: bool,
    },
    /// Hands the item back unworked: ready again at once, the attempt not counted.
    Released {
        attempt: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// The answer to a report: the item's status now.
/// Which jobs a bulk action touches (`POST /admin/jobs/{action}`); fields left None match any.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submitted_before: Option<String>,
    /// Count the jobs the filter matches now and change none.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// How many jobs a bulk action matched and changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkAnswer {
    pub matched: u64,
    pub changed: u64,
}

/// A job after a retry (`POST /jobs/{id}/retry`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetriedJob {
    #[serde(flatten)]
    pub job: JobDocument,
    /// How many items that had failed for good are ready again.
    pub retried: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReportAnswer {
    pub id: i64,
    pub status: ItemStatus,
    /// After a heartbeat: when the lease now ends.
    #[serde(default)]
    pub lease_expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The answer to a submission.
#[derive(Debug, Clone, Deserialize)]
pub struct Submitted {
    pub job_id: JobId,
}

/// What a job can be told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Pause,
    Resume,
    Cancel,
}

impl JobAction {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Cancel => "cancel",
        }
    }
}

/// A recount of every counter.
#[derive(Debug, Clone, Deserialize)]
pub struct Consistency {
    pub consistent: bool,
    pub mismatches: Vec<Mismatch>,
}

#[derive(Deserialize)]
struct Rows<T> {
    rows: Vec<T>,
}

#[derive(Deserialize)]
struct Services {
    services: Vec<ServiceSummary>,
}

#[derive(Deserialize)]
struct Shares {
    users: Vec<UserShare>,
}

#[derive(Deserialize)]
struct WorkItems {
    work_items: Vec<WorkItem>,
}

#[derive(Deserialize)]
struct Tenants {
    tenants: Vec<TenantDocument>,
}

#[derive(Deserialize)]
struct Queriers {
    queriers: Vec<QuerierDocument>,
}

#[derive(Deserialize)]
struct Tokens {
    tokens: Vec<TokenDocument>,
}

/// A token just made: its secret, shown this once, and what is stored of it.
#[derive(Debug, Clone, Deserialize)]
pub struct CreatedToken {
    pub token: String,
    pub details: TokenDocument,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// Longer than any long poll the broker holds (60 s), so that a wait ends at the broker.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(75);

impl Client {
    /// A client of the broker at `brokers` (for example `http://127.0.0.1:8080`), or of any of
    /// several given as a comma-separated list, sending `token` as a bearer token when given.
    /// An `https://` broker's certificate must chain to one of the system's trusted roots.
    pub fn new(brokers: &str, token: Option<String>) -> Result<Self, ClientError> {
        Self::trusting(brokers, token, None)
    }

    /// As [`Client::new`], trusting also the CA certificates in the PEM file `ca_cert`: a
    /// broker whose certificate a private CA signed.
    pub fn trusting(
        brokers: &str,
        token: Option<String>,
        ca_cert: Option<&Path>,
    ) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some(path) = ca_cert {
            let unusable = |reason: String| ClientError::CaCert { path: path.to_owned(), reason };
            let pem = std::fs::read(path).map_err(|error| unusable(error.to_string()))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|error| unusable(error.to_string()))?;
            if roots.is_empty() {
                return Err(unusable("it holds no PEM certificate".to_owned()));
            }
            builder = roots.into_iter().fold(builder, reqwest::ClientBuilder::add_root_certificate);
        }
        let brokers = Arc::new(Brokers::parse(brokers)?);
        Ok(Self { brokers, token, http: builder.build()? })
    }

    /// A request built against the first broker's address; [`Client::send`] moves it to the
    /// broker it goes to.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let base = &self.brokers.bases[0];
        let request =
            self.http.request(method, format!("{}{path}", base.as_str().trim_end_matches('/')));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends `request` to the broker the client sends to now, and on to the next while one
    /// refuses the connection or answers 503 (a broker draining, or one that changed nothing);
    /// the broker that answers is the one the next request goes to. Past the last broker, its
    /// answer or error is the answer.
    async fn send(&self, request: RequestBuilder) -> Result<Response, ClientError> {
        let mut request = request.build()?;
        let count = self.brokers.bases.len();
        let first = self.brokers.current.load(Ordering::Relaxed);
        let mut target = first;
        for tried in 1..count {
            // A body that cannot be sent twice (none of this client's) goes to one broker only.
            let Some(mut attempt) = request.try_clone() else { break };
            *attempt.url_mut() = self.brokers.at(target, attempt.url());
            match self.http.execute(attempt).await {
                Ok(answer) if answer.status() != StatusCode::SERVICE_UNAVAILABLE => {
                    self.brokers.current.store(target, Ordering::Relaxed);
                    return Ok(answer);
                }
                Ok(_) => {}
                Err(error) if error.is_connect() && !is_untrusted_certificate(&error) => {}
                Err(error) => return Err(error.into()),
            }
            target = (first + tried) % count;
        }
        *request.url_mut() = self.brokers.at(target, request.url());
        let answer = self.http.execute(request).await?;
        self.brokers.current.store(target, Ordering::Relaxed);
        Ok(answer)
    }

    /// Whether the broker is up and reaches its database.
    pub async fn ready(&self) -> Result<(), ClientError> {
        decode::<Value>(self.send(self.request(Method::GET, "/readyz")).await?).await.map(|_| ())
    }

    /// Submits a job, given as the JSON body `POST /jobs` takes.
    pub async fn submit(&self, job: &Value) -> Result<Submitted, ClientError> {
        decode(self.send(self.request(Method::POST, "/jobs").json(job)).await?).await
    }

    /// Submits a job with an Idempotency-Key: sent again with the same key and job (a timeout
    /// left it unknown whether the first arrived), it gets the first answer and creates no
    /// second job.
    pub async fn submit_idempotent(
        &self,
        job: &Value,
        key: &str,
    ) -> Result<Submitted, ClientError> {
        let request = self.request(Method::POST, "/jobs").header("Idempotency-Key", key);
        decode(self.send(request.json(job)).await?).await
    }

    pub async fn job(&self, job_id: JobId) -> Result<JobDocument, ClientError> {
        let path = format!("/jobs/{}", job_id.0);
        decode(self.send(self.request(Method::GET, &path)).await?).await
    }

    /// The job once it has finished, or as it is after `wait` (at most 60 s) if it has not.
    pub async fn wait_for_job(
        &self,
        job_id: JobId,
        wait: Duration,
    ) -> Result<JobDocument, ClientError> {
        let path = format!("/jobs/{}", job_id.0);
        let query = [("wait", wait.as_secs().to_string())];
        decode(self.send(self.request(Method::GET, &path).query(&query)).await?).await
    }

    /// Pauses, resumes or cancels a job, and returns it as it is now.
    pub async fn steer(
        &self,
        job_id: JobId,
        action: JobAction,
    ) -> Result<JobDocument, ClientError> {
        let path = format!("/jobs/{}/{}", job_id.0, action.as_str());
        decode(self.send(self.request(Method::POST, &path)).await?).await
    }

    /// Puts every item of the job that failed for good back to ready, with a fresh retry
    /// budget; returns the job as it is now and how many items were retried.
    pub async fn retry(&self, job_id: JobId) -> Result<RetriedJob, ClientError> {
        let path = format!("/jobs/{}/retry", job_id.0);
        decode(self.send(self.request(Method::POST, &path)).await?).await
    }

    /// Applies `action` (pause, resume, cancel or retry) to every job `filter` matches; with
    /// `filter.dry_run`, only counts them.
    pub async fn bulk(&self, action: &str, filter: &JobFilter) -> Result<BulkAnswer, ClientError> {
        let path = format!("/admin/jobs/{action}");
        decode(self.send(self.request(Method::POST, &path).json(filter)).await?).await
    }

    /// Claims work; an empty answer means none came within the wait.
    pub async fn claim(&self, params: &ClaimParams<'_>) -> Result<Vec<WorkItem>, ClientError> {
        Ok(self.claim_answer(params).await?.items)
    }

    /// Claims work, and says whether the broker knows the service at all.
    pub async fn claim_answer(&self, params: &ClaimParams<'_>) -> Result<Claimed, ClientError> {
        let query = [
            ("service", params.service.to_owned()),
            ("querier", params.querier.to_owned()),
            ("worker", params.worker.to_string()),
            ("max", params.max.to_string()),
            ("wait", params.wait.as_secs().to_string()),
        ];
        let response = self.send(self.request(Method::GET, "/work").query(&query)).await?;
        if response.status() == StatusCode::NO_CONTENT {
            let unknown_service = response.headers().contains_key(UNKNOWN_SERVICE);
            return Ok(Claimed { items: Vec::new(), unknown_service });
        }
        let items = decode::<WorkItems>(response).await?.work_items;
        Ok(Claimed { items, unknown_service: false })
    }

    /// Says that `querier` is leaving: its waiting work requests end (410), it gets no more
    /// work, and it leaves its tenants' shards once it holds no lease.
    pub async fn shut_down_querier(&self, querier: &str) -> Result<(), ClientError> {
        let path = format!("/queriers/{querier}/shutdown");
        decode::<Value>(self.send(self.request(Method::POST, &path)).await?).await.map(|_| ())
    }

    pub async fn report(&self, item: i64, report: &Report) -> Result<ReportAnswer, ClientError> {
        let path = format!("/work/{item}/status");
        decode(self.send(self.request(Method::POST, &path).json(report)).await?).await
    }

    /// Rows of the user_work table, optionally of one service and one user.
    pub async fn user_work(
        &self,
        service: Option<&str>,
        user: Option<&str>,
        limit: u32,
    ) -> Result<Vec<UserWorkRow>, ClientError> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(service.map(|service| ("service", service.to_owned())));
        query.extend(user.map(|user| ("user", user.to_owned())));
        let response =
            self.send(self.request(Method::GET, "/admin/user-work").query(&query)).await?;
        Ok(decode::<Rows<UserWorkRow>>(response).await?.rows)
    }

    /// Each service's queue, and this broker's claims per second and waiting workers.
    pub async fn services(&self) -> Result<Vec<ServiceSummary>, ClientError> {
        let response = self.send(self.request(Method::GET, "/admin/services")).await?;
        Ok(decode::<Services>(response).await?.services)
    }

    /// The users with the most running items of `service`, with their ready items.
    pub async fn shares(&self, service: &str, limit: u32) -> Result<Vec<UserShare>, ClientError> {
        let query = [("service", service.to_owned()), ("limit", limit.to_string())];
        let response = self.send(self.request(Method::GET, "/admin/shares").query(&query)).await?;
        Ok(decode::<Shares>(response).await?.users)
    }

    pub async fn tenants(&self) -> Result<Vec<TenantDocument>, ClientError> {
        let response = self.send(self.request(Method::GET, "/admin/tenants")).await?;
        Ok(decode::<Tenants>(response).await?.tenants)
    }

    pub async fn tenant(&self, tenant: &str) -> Result<TenantDocument, ClientError> {
        let path = format!("/admin/tenants/{tenant}");
        decode(self.send(self.request(Method::GET, &path)).await?).await
    }

    /// Changes a tenant's limits and policy, creating it if needed: the values given; None
    /// keeps a value.
    pub async fn set_tenant(
        &self,
        tenant: &str,
        change: &TenantChange,
    ) -> Result<TenantDocument, ClientError> {
        let path = format!("/admin/tenants/{tenant}");
        decode(self.send(self.request(Method::PUT, &path).json(change)).await?).await
    }

    /// A service's cap, rate limit and running items.
    pub async fn service_policy(
        &self,
        service: &str,
    ) -> Result<ServicePolicyDocument, ClientError> {
        let path = format!("/admin/services/{service}");
        decode(self.send(self.request(Method::GET, &path)).await?).await
    }

    /// Changes a service's cap and rate limit: the values given; None keeps a value.
    pub async fn set_service_policy(
        &self,
        service: &str,
        change: &PolicyChange,
    ) -> Result<ServicePolicyDocument, ClientError> {
        let path = format!("/admin/services/{service}");
        decode(self.send(self.request(Method::PUT, &path).json(change)).await?).await
    }

    /// A user's weight, cap, rate limit and running items.
    pub async fn user_policy(&self, user: &str) -> Result<UserPolicyDocument, ClientError> {
        let path = format!("/admin/users/{user}");
        decode(self.send(self.request(Method::GET, &path)).await?).await
    }

    /// Changes a user's weight, cap and rate limit, for a user not yet seen too: the values
    /// given; None keeps a value.
    pub async fn set_user_policy(
        &self,
        user: &str,
        change: &PolicyChange,
    ) -> Result<UserPolicyDocument, ClientError> {
        let path = format!("/admin/users/{user}");
        decode(self.send(self.request(Method::PUT, &path).json(change)).await?).await
    }

    pub async fn queriers(&self) -> Result<Vec<QuerierDocument>, ClientError> {
        let response = self.send(self.request(Method::GET, "/admin/queriers")).await?;
        Ok(decode::<Queriers>(response).await?.queriers)
    }

    /// Which build the broker is, and what its database holds (`GET /admin/version`).
    pub async fn version(&self) -> Result<VersionDocument, ClientError> {
        decode(self.send(self.request(Method::GET, "/admin/version")).await?).await
    }

    pub async fn consistency(&self) -> Result<Consistency, ClientError> {
        decode(self.send(self.request(Method::GET, "/admin/consistency")).await?).await
    }

    /// Makes a token, as the body of `POST /admin/tokens` describes it.
    pub async fn create_token(&self, body: &Value) -> Result<CreatedToken, ClientError> {
        decode(self.send(self.request(Method::POST, "/admin/tokens").json(body)).await?).await
    }

    pub async fn tokens(&self) -> Result<Vec<TokenDocument>, ClientError> {
        let response = self.send(self.request(Method::GET, "/admin/tokens")).await?;
        Ok(decode::<Tokens>(response).await?.tokens)
    }

    pub async fn revoke_token(&self, id: i64) -> Result<TokenDocument, ClientError> {
        let path = format!("/admin/tokens/{id}/revoke");
        decode(self.send(self.request(Method::POST, &path)).await?).await
    }
}

/// The document a successful answer holds, or the broker's error.
async fn decode<T: DeserializeOwned>(response: Response) -> Result<T, ClientError> {
    let status = response.status();
    // Seconds only: the broker never sends an HTTP date.
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok()?.trim().parse().ok())
        .map(Duration::from_secs);
    let body = response.bytes().await?;
    if status.is_success() {
        return serde_json::from_slice(&body).map_err(|_| ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(ErrorBody { error }) => {
            Err(ClientError::Api { status, code: error.code, message: error.message, retry_after })
        }
        Err(_) => Err(ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> reqwest::Url {
        reqwest::Url::parse(text).expect("a URL")
    }

    #[test]
    fn a_request_moves_between_brokers_keeping_its_path_below_each_base() {
        let brokers =
            Brokers::parse("http://a:1/fairway/, http://b:2, https://c:3/x/y").expect("brokers");
        let built = url("http://a:1/fairway/work?service=s&wait=20");
        assert_eq!(brokers.at(0, &built), built, "the first broker's own request stays as it is");
        assert_eq!(brokers.at(1, &built), url("http://b:2/work?service=s&wait=20"));
        assert_eq!(brokers.at(2, &built), url("https://c:3/x/y/work?service=s&wait=20"));
    }

    #[test]
    fn a_list_without_a_broker_or_with_a_bad_one_is_refused() {
        for list in ["", " , ", "localhost:8080", "http://a:1,ftp://b"] {
            assert!(matches!(Brokers::parse(list), Err(ClientError::Url(_))), "{list:?}");
        }
    }
}
