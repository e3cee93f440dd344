//! The one place where a transaction PostgreSQL aborted for a deadlock (40P01) or a
//! serialization failure (40001) runs again. Every broker transaction goes through
//! [`Core::retrying`]: a whole transaction, started afresh each time, is the unit retried, and
//! whatever it answers is answered only once one run of it committed. A group-commit batch
//! (`batch.rs`) retries as a whole, with every request it gathered, before any is answered.

use std::future::Future;
use std::time::Duration;

use crate::core::Core;
use crate::error::BrokerError;

/// Runs of one transaction, the first included, before its contention is reported.
pub const ATTEMPTS: u32 = 3;

/// The pause before the second run; each further pause doubles. Each is jittered by ±50 %, so
/// that the transactions that deadlocked with each other do not meet again in step.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

impl Core {
    /// Runs `run` (one whole transaction: it takes its connection, begins, commits) up to
    /// [`ATTEMPTS`] times while it fails with a deadlock or a serialization failure, counting
    /// each retry in `fairway_transaction_retries_total` under `operation`. When every run
    /// failed so, the answer is [`BrokerError::Contended`] (HTTP 503 with Retry-After), and
    /// nothing was changed: each run rolled back. Any other outcome is returned as it came.
    pub async fn retrying<T, F, Fut>(
        &self,
        operation: &'static str,
        mut run: F,
    ) -> Result<T, BrokerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, BrokerError>>,
    {
        let mut attempt = 1;
        loop {
            let error = match run().await {
                Err(error) => error,
                answer => return answer,
            };
            let Some((sqlstate, reason)) = error.transient() else {
                return Err(error);
            };
            if attempt >= ATTEMPTS {
                tracing::warn!(operation, %error, attempts = attempt, "transaction retries exhausted");
                self.metrics.transaction_retries_exhausted(operation, sqlstate);
                return Err(BrokerError::Contended {
                    operation,
                    sqlstate,
                    reason,
                    attempts: attempt,
                });
            }
            tracing::info!(operation, %error, attempt, "transaction aborted; running it again");
            self.metrics.transaction_retried(operation, sqlstate);
            tokio::time::sleep(backoff(attempt)).await;
            attempt += 1;
        }
    }
}

/// The pause after failed run `attempt` (1-based): FIRST_BACKOFF doubled per run, times a
/// random factor in [0.5, 1.5).
fn backoff(attempt: u32) -> Duration {
    let base = FIRST_BACKOFF * 2u32.saturating_pow(attempt.saturating_sub(1));
    base.mul_f64(0.5 + unit_random())
}

/// A random number in [0, 1] for a jitter: 64 random bits are plenty, and uuid's v4 already
/// draws them from the OS.
pub(crate) fn unit_random() -> f64 {
    (uuid::Uuid::new_v4().as_u128() as u64) as f64 / u64::MAX as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_jitter() {
        for attempt in 1..ATTEMPTS {
            let base = FIRST_BACKOFF * 2u32.pow(attempt - 1);
            for _ in 0..100 {
                let pause = backoff(attempt);
                assert!(pause >= base / 2 && pause < base * 3 / 2, "{pause:?} for {attempt}");
            }
        }
    }
}
