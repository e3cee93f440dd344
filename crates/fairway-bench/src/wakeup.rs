//! Wake-up latency: how long after a job is submitted does an idle, long-polling worker hold
//! its item (`wakeup`); and how long after a job's last item completes does a producer waiting
//! for the job get its answer (`job_wakeup`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::BenchError;
use fairway_broker::Broker;

const SERVICE: &str = "wakeup";
/// How long to wait for a long poll to be registered before acting on it.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Waits until `waiting` says the long poll is registered, so that the wake-up is what's timed.
async fn settle(waiting: impl Fn() -> bool, who: &str) -> Result<(), BenchError> {
    let settle = Instant::now();
    while !waiting() {
        if settle.elapsed() > SETTLE_LIMIT {
            return Err(BenchError::Unexpected(format!("the {who} never started waiting")));
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// What a long poll answered, and when its answer arrived.
struct Answer {
    status: reqwest::StatusCode,
    received: Instant,
    body: Value,
}

/// Sends a GET that long-polls, in a task of its own.
fn long_poll(
    client: &reqwest::Client,
    url: String,
) -> tokio::task::JoinHandle<Result<Answer, BenchError>> {
    let client = client.clone();
    tokio::spawn(async move {
        let response = client.get(url).send().await?.error_for_status()?;
        let status = response.status();
        let received = Instant::now();
        let body = if status == reqwest::StatusCode::NO_CONTENT {
            Value::Null
        } else {
            response.json().await?
        };
        Ok(Answer { status, received, body })
    })
}

async fn answer(
    waiter: tokio::task::JoinHandle<Result<Answer, BenchError>>,
) -> Result<Answer, BenchError> {
    waiter.await.map_err(|e| BenchError::Unexpected(e.to_string()))?
}

fn micros(from: Instant, to: Instant) -> u32 {
    to.duration_since(from).as_micros().min(u128::from(u32::MAX)) as u32
}

/// Runs `trials` wake-ups against the broker at `base`; returns each latency in microseconds.
pub async fn measure(broker: &Broker, base: &str, trials: usize) -> Result<Vec<u32>, BenchError> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(trials);
    for trial in 0..trials {
        let waiter =
            long_poll(&client, format!("{base}/work?service={SERVICE}&querier=wakeup&wait=30"));
        settle(|| broker.waiting_workers().get(SERVICE).copied().unwrap_or(0) > 0, "worker")
            .await?;
        let submitted = Instant::now();
        client
            .post(format!("{base}/jobs"))
            .json(&json!({ "user": format!("waker-{trial}"), "steps": [{ "service": SERVICE }], "items": [{}] }))
            .send()
            .await?
            .error_for_status()?;
        let Answer { status, received, body } = answer(waiter).await?;
        if status != reqwest::StatusCode::OK {
            return Err(BenchError::Unexpected(format!("the waiting worker got {status}: {body}")));
        }
        latencies.push(micros(submitted, received));
    }
    Ok(latencies)
}

/// Runs `trials` job wake-ups against the broker at `base`: a producer waits for a
/// synchronous one-item job with `wait=30`, a worker completes the item, and the latency runs
/// from when the completion is sent (so that it includes the completion's own transaction) to
/// when the producer's answer arrives. Returns each in microseconds.
pub async fn measure_job(
    broker: &Broker,
    base: &str,
    trials: usize,
) -> Result<Vec<u32>, BenchError> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(trials);
    for trial in 0..trials {
        let job: Value = client
            .post(format!("{base}/jobs"))
            .json(&json!({ "user": format!("producer-{trial}"), "is_async": false, "steps": [{ "service": SERVICE }], "items": [{}] }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let job_id = job["job_id"].as_str().unwrap_or_default().to_owned();
        let claimed: Value = client
            .get(format!("{base}/work?service={SERVICE}&querier=job-wakeup"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let item = &claimed["work_items"][0];
        let waiter = long_poll(&client, format!("{base}/jobs/{job_id}?wait=30"));
        settle(|| broker.job_waiters() > 0, "producer").await?;
        let completed = Instant::now();
        client
            .post(format!("{base}/work/{}/status", item["id"]))
            .json(&json!({ "status": "successful", "attempt": item["attempt"], "results": [] }))
            .send()
            .await?
            .error_for_status()?;
        let Answer { status, received, body } = answer(waiter).await?;
        if status != reqwest::StatusCode::OK || body["status"] != "successful" {
            return Err(BenchError::Unexpected(format!(
                "the waiting producer got {status}: {body}"
            )));
        }
        latencies.push(micros(completed, received));
    }
    Ok(latencies)
}
