//! Test-only fault injection, compiled only with the `fault-injection` cargo feature (`make
//! test` turns it on; release builds do not carry it). A test arms a point for a number of runs;
//! each armed run of the transaction that passes that point meets a real deadlock, which
//! PostgreSQL's deadlock detector breaks by aborting the broker's transaction with 40P01. A
//! test may also hold the next run that passes a point there until it lets it go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::Notify;

use crate::error::BrokerError;

/// Where in a transaction a fault may strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// In a batch of attempt endings, after finish_items ran (so its changes are there to be
    /// rolled back).
    EndAttempts,
    /// In a job's submission, after its rows were written.
    SubmitJob,
    /// In a claim batch, once its claims committed, before they are answered.
    ClaimCommitted,
}

/// A run held at a point: the test learns when it got there, and lets it go on.
#[derive(Default)]
pub struct Hold {
    reached: Notify,
    go: Notify,
}

impl Hold {
    /// Completes once a run got to the point (at once if one already did).
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the held run go on.
    pub fn release(&self) {
        self.go.notify_one();
    }
}

/// How long the rival session waits, holding its lock, before it asks for the broker's: long
/// enough for the broker's transaction to be waiting first, so that the broker's deadlock check
/// (after deadlock_timeout, 1 s by default) is the first to run and picks the broker as victim.
const RIVAL_DELAY: Duration = Duration::from_millis(200);

pub struct Faults {
    pool: Pool,
    armed: Mutex<HashMap<Point, u32>>,
    holds: Mutex<HashMap<Point, Arc<Hold>>>,
}

impl Faults {
    pub(crate) fn new(pool: Pool) -> Self {
        Self { pool, armed: Mutex::new(HashMap::new()), holds: Mutex::new(HashMap::new()) }
    }

    /// The next run that passes `point` waits there until the test releases it.
    pub fn hold(&self, point: Point) -> Arc<Hold> {
        let hold = Arc::new(Hold::default());
        self.holds.lock().unwrap_or_else(PoisonError::into_inner).insert(point, hold.clone());
        hold
    }

    /// Waits at `point` if a test holds it.
    pub(crate) async fn pause(&self, point: Point) {
        let hold = self.holds.lock().unwrap_or_else(PoisonError::into_inner).remove(&point);
        if let Some(hold) = hold {
            hold.reached.notify_one();
            hold.go.notified().await;
        }
    }

    /// The next `runs` transactions that pass `point` each deadlock there.
    pub fn deadlock(&self, point: Point, runs: u32) {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner).insert(point, runs);
    }

    /// How many armed runs of `point` are still to strike.
    pub fn armed(&self, point: Point) -> u32 {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner).get(&point).copied().unwrap_or(0)
    }

    fn take(&self, point: Point) -> bool {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        match armed.get_mut(&point) {
            Some(runs) if *runs > 0 => {
                *runs -= 1;
                true
            }
            _ => false,
        }
    }

    /// If `point` is armed, deadlocks the open transaction on `tx` against a second session:
    /// the rival takes lock B, the transaction lock A, then the transaction asks for B and the
    /// rival for A. Returns the transaction's error (40P01); the rival then gets A and ends.
    pub(crate) async fn strike(
        &self,
        point: Point,
        tx: &impl GenericClient,
    ) -> Result<(), BrokerError> {
        if !self.take(point) {
            return Ok(());
        }
        let seed = uuid::Uuid::new_v4().as_u128() as i64;
        let (a, b) = (seed, seed.wrapping_add(1));
        let rival = self.pool.get().await?;
        rival.batch_execute("BEGIN").await?;
        rival.execute("SELECT pg_advisory_xact_lock($1)", &[&b]).await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&a]).await?;
        let rival_task = tokio::spawn(async move {
            tokio::time::sleep(RIVAL_DELAY).await;
            // Waits until the broker's transaction is aborted, then holds A until it ends.
            let taken = rival.execute("SELECT pg_advisory_xact_lock($1)", &[&a]).await;
            let _ = rival.batch_execute("ROLLBACK").await;
            taken
        });
        let deadlocked = tx.execute("SELECT pg_advisory_xact_lock($1)", &[&b]).await;
        match deadlocked {
            Err(error) => {
                tracing::info!(?point, %error, "injected deadlock");
                Err(error.into())
            }
            Ok(_) => {
                // The rival was picked as the victim instead: no fault this time.
                let _ = rival_task.await;
                Ok(())
            }
        }
    }
}
