//! Wake-up latency: how long after a job is submitted does an idle, long-polling worker hold
//! its item.

use std::time::{Duration, Instant};

use serde_json::json;

use super::BenchError;
use crate::broker::Broker;

const SERVICE: &str = "wakeup";
/// How long to wait for the worker's long poll to be registered before submitting.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Runs `trials` wake-ups against the broker at `base`; returns each latency in microseconds.
pub async fn measure(broker: &Broker, base: &str, trials: usize) -> Result<Vec<u32>, BenchError> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(trials);
    for trial in 0..trials {
        let waiter = {
            let client = client.clone();
            let url = format!("{base}/work?service={SERVICE}&querier=wakeup&wait=30");
            tokio::spawn(async move {
                let response = client.get(url).send().await?.error_for_status()?;
                let status = response.status();
                let received = Instant::now();
                let body = response.bytes().await?;
                Ok::<_, BenchError>((status, received, body))
            })
        };
        // Submit only once the worker is really waiting, so that the wake-up is what's timed.
        let settle = Instant::now();
        while broker.waiting_workers().get(SERVICE).copied().unwrap_or(0) == 0 {
            if settle.elapsed() > SETTLE_LIMIT {
                return Err(BenchError::Unexpected(
                    "the wake-up worker never started waiting".into(),
                ));
            }
            tokio::task::yield_now().await;
        }
        let submitted = Instant::now();
        client
            .post(format!("{base}/jobs"))
            .json(&json!({ "user": format!("waker-{trial}"), "steps": [{ "service": SERVICE }], "items": [{}] }))
            .send()
            .await?
            .error_for_status()?;
        let (status, received, body) =
            waiter.await.map_err(|e| BenchError::Unexpected(e.to_string()))??;
        if status != reqwest::StatusCode::OK {
            return Err(BenchError::Unexpected(format!(
                "the waiting worker got {status}: {body:?}"
            )));
        }
        latencies
            .push(received.duration_since(submitted).as_micros().min(u128::from(u32::MAX)) as u32);
    }
    Ok(latencies)
}
