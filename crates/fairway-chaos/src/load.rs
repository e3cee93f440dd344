//! The fault suite's producers: asynchronous jobs submitted at a steady pace, and synchronous
//! users who each submit a job and wait for it, over two tenants and three workflow shapes,
//! under policies that weigh, cap and rate-limit some of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::drive::Refusal;
use super::{now_ms, IDLE_SERVICE, SERVICES};
use fairway_api::model::{JobDocument, JobId, JobStatus};
use fairway_api::policy::PolicyChange;
use fairway_api::tenancy::TenantChange;
use fairway_client::{Client, ClientError};

const TENANTS: [&str; 2] = ["tenant-a", "tenant-b"];
const USERS_PER_TENANT: u64 = 4;
/// Synchronous users, each waiting for one job at a time.
const SYNC_USERS: u64 = 4;
/// Pause before asking again after a broker could not answer.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long one request for a job's end waits at the broker.
const JOB_WAIT: Duration = Duration::from_secs(20);

/// The users' policies the suite runs under: two weighted users, one of them in a higher
/// tier, a capped one and a rate-limited one. Their names are those `async_job` gives.
const USER_POLICIES: [(&str, PolicyChange); 4] = [
    ("tenant-a-user-0", PolicyChange { weight: Some(4), tier: Some(2), ..NO_CHANGE }),
    ("tenant-a-user-1", PolicyChange { weight: Some(2), ..NO_CHANGE }),
    ("tenant-a-user-2", PolicyChange { max_running: Some(2), ..NO_CHANGE }),
    ("tenant-b-user-1", PolicyChange { rate_per_second: Some(20.0), burst: Some(4), ..NO_CHANGE }),
];

/// The capped tenant, and its cap: below what the workers could run of it. Its tier is raised
/// above the others', so that the cap is all that bounds it.
const CAPPED_TENANT: (&str, i32) = ("tenant-b", 10);

const NO_CHANGE: PolicyChange = PolicyChange {
    weight: None,
    tier: None,
    max_running: None,
    rate_per_second: None,
    burst: None,
};

/// Sets the suite's policies, before any work arrives.
pub async fn set_policies(client: &Client) -> Result<(), ClientError> {
    for (user, change) in &USER_POLICIES {
        client.set_user_policy(user, change).await?;
    }
    let (tenant, cap) = CAPPED_TENANT;
    let change = TenantChange {
        policy: PolicyChange { max_running: Some(cap), tier: Some(2), ..NO_CHANGE },
        ..TenantChange::default()
    };
    client.set_tenant(tenant, &change).await?;
    Ok(())
}

/// A job the suite submitted and the items each of its steps must end with.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub job: JobId,
    pub steps: Vec<i64>,
}

/// The producers' shared state.
pub struct Load {
    pub clients: Vec<Client>,
    pub jobs: Mutex<Vec<Tracked>>,
    pub refused: Mutex<Vec<Refusal>>,
    pub stop: CancellationToken,
    pub sync_jobs_done: AtomicU64,
    submitted: AtomicU64,
}

impl Load {
    pub fn new(clients: Vec<Client>) -> Arc<Self> {
        Arc::new(Self {
            clients,
            jobs: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
            sync_jobs_done: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
        })
    }

    /// Starts the producers: an asynchronous job every `every`, and the synchronous users.
    pub fn start(self: &Arc<Self>, every: Duration) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = vec![tokio::spawn(self.clone().submit_async(every))];
        tasks.extend((0..SYNC_USERS).map(|user| tokio::spawn(self.clone().sync_user(user))));
        tasks
    }

    fn note(&self, refusal: Refusal) {
        if let Ok(mut refused) = self.refused.lock() {
            refused.push(refusal);
        }
    }

    async fn submit_async(self: Arc<Self>, every: Duration) {
        let mut ticker = tokio::time::interval(every);
        while !self.stop.is_cancelled() {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let n = self.submitted.fetch_add(1, Ordering::Relaxed);
            let (job, steps) = async_job(n);
            let _ = self.submit(&job, steps).await;
        }
    }

    /// A synchronous user: submits a small job, waits for it to finish, and again.
    async fn sync_user(self: Arc<Self>, user: u64) {
        while !self.stop.is_cancelled() {
            let (job, steps) = sync_job(user);
            let Some(job_id) = self.submit(&job, steps).await else { continue };
            if self.wait_for(job_id, None).await.is_some() {
                self.sync_jobs_done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Submits `job` until a broker takes it, moving to the next broker after each failure.
    /// None once told to stop. A submission whose answer was lost may leave a job the suite
    /// does not track; the final check counts every job in the database.
    pub async fn submit(&self, job: &Value, steps: Vec<i64>) -> Option<JobId> {
        let mut broker = self.submitted.load(Ordering::Relaxed) as usize;
        loop {
            let client = &self.clients[broker % self.clients.len()];
            let sent = now_ms();
            match client.submit(job).await {
                Ok(submitted) => {
                    let tracked = Tracked { job: submitted.job_id, steps };
                    if let Ok(mut jobs) = self.jobs.lock() {
                        jobs.push(tracked);
                    }
                    return Some(submitted.job_id);
                }
                Err(error) => {
                    self.note(Refusal::of("submit", &error, false, sent));
                    if !error.is_transient() {
                        return None;
                    }
                }
            }
            if self.stop.is_cancelled() {
                return None;
            }
            broker += 1;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Waits for the job to finish, through any broker that answers; None when `deadline`
    /// (or, without one, the stop) comes first.
    pub async fn wait_for(&self, job: JobId, deadline: Option<Instant>) -> Option<JobDocument> {
        let mut broker = job.0.as_u128() as usize;
        loop {
            let client = &self.clients[broker % self.clients.len()];
            let sent = now_ms();
            let waited = tokio::select! {
                _ = self.stop.cancelled(), if deadline.is_none() => return None,
                waited = client.wait_for_job(job, JOB_WAIT) => waited,
            };
            match waited {
                Ok(document) if finished(document.status) => return Some(document),
                Ok(_) => {}
                Err(error) => {
                    self.note(Refusal::of("wait", &error, false, sent));
                    broker += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
            if deadline.is_some_and(|deadline| Instant::now() > deadline) {
                return None;
            }
        }
    }

    pub fn tracked(&self) -> Vec<Tracked> {
        self.jobs.lock().map(|jobs| jobs.clone()).unwrap_or_default()
    }

    pub fn refusals(&self) -> Vec<Refusal> {
        self.refused.lock().map(|refused| refused.clone()).unwrap_or_default()
    }
}

pub fn finished(status: JobStatus) -> bool {
    !matches!(status, JobStatus::Accepted | JobStatus::Running | JobStatus::Paused)
}

fn items(count: usize) -> Vec<Value> {
    (0..count).map(|n| json!({ "payload": { "n": n } })).collect()
}

/// Job `n` of the asynchronous stream: alternating tenants, four users each, and in turn a
/// one-step job, a step then an aggregation, and two steps then an aggregation.
fn async_job(n: u64) -> (Value, Vec<i64>) {
    let tenant = TENANTS[n as usize % TENANTS.len()];
    let user = format!("{tenant}-user-{}", (n / 2) % USERS_PER_TENANT);
    let [a, b, c] = SERVICES;
    let (steps, expected) = match n % 3 {
        0 => (json!([{ "service": a }]), vec![8]),
        1 => (json!([{ "service": a }, { "service": b, "aggregate": true }]), vec![8, 1]),
        _ => (
            json!([{ "service": a }, { "service": b }, { "service": c, "aggregate": true }]),
            vec![6, 6, 1],
        ),
    };
    let count = expected[0] as usize;
    let job = json!({ "user": user, "tenant": tenant, "is_async": true, "steps": steps, "items": items(count) });
    (job, expected)
}

/// A synchronous user's job: three items, then an aggregation.
fn sync_job(user: u64) -> (Value, Vec<i64>) {
    let tenant = TENANTS[user as usize % TENANTS.len()];
    let [a, _, c] = SERVICES;
    let steps = json!([{ "service": a }, { "service": c, "aggregate": true }]);
    let job = json!({ "user": format!("{tenant}-sync-{user}"), "tenant": tenant, "is_async": false,
                      "steps": steps, "items": items(3) });
    (job, vec![3, 1])
}

/// The job whose items only vanishing long polls wait for.
pub fn idle_job(count: usize) -> (Value, Vec<i64>) {
    let job = json!({ "user": "vanishing-polls", "tenant": TENANTS[0], "is_async": false,
                      "steps": [{ "service": IDLE_SERVICE }], "items": items(count) });
    (job, vec![count as i64])
}
