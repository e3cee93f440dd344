use std::pin::pin;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::model::{ClaimRequest, JobId, WorkItem, WorkItemId};
use super::sql::{self, CLAIM_NEXT_ITEM, HAS_CLAIMABLE_WORK};
use super::{Broker, BrokerError};

impl Broker {
    /// Hands out up to `request.max` work items of the service in one transaction, each chosen
    /// by the fair order as a single claim would choose it. Empty when nothing is ready.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Vec<WorkItem>, BrokerError> {
        let mut client = self.client().await?;
        let service = request.service.as_str();
        let lease = self.lease_millis();
        let querier = request.querier.as_str();
        let claim = |wait: &'static bool| -> [&(dyn ToSql + Sync); 5] {
            [&service, &querier, &request.worker, &lease, wait]
        };
        if request.max == 1 {
            // The common case is one statement: let it commit on its own, without BEGIN/COMMIT.
            let row = claim_one(&client, &claim(&true)).await?;
            return row.map(|row| work_item(&row, service)).into_iter().collect();
        }
        let tx = client.transaction().await?;
        let mut items = Vec::with_capacity(request.max);
        while items.len() < request.max {
            // Only the first item of a batch may wait for a busy user: a batch that holds one
            // user's lock and waits for another's could deadlock with a batch doing the reverse.
            let wait = if items.is_empty() { &true } else { &false };
            match claim_one(&tx, &claim(wait)).await? {
                Some(row) => items.push(work_item(&row, service)?),
                None => break,
            }
        }
        tx.commit().await?;
        Ok(items)
    }

    /// Like `claim`, but when nothing is ready waits up to `wait` for work of the service to
    /// appear, woken by the database's notifications rather than by polling.
    pub async fn claim_waiting(
        &self,
        request: &ClaimRequest,
        wait: Duration,
    ) -> Result<Vec<WorkItem>, BrokerError> {
        let deadline = Instant::now() + wait;
        let signal = self.signals.for_service(request.service.as_str());
        loop {
            let mut notified = pin!(signal.notified());
            notified.as_mut().enable();
            let items = self.claim(request).await?;
            if !items.is_empty() || Instant::now() >= deadline {
                return Ok(items);
            }
            let _waiting = signal.waiting();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(items);
            }
        }
    }
}

/// How often a claim retries when it lost a race for the work it chose (another claim or a
/// cancel took it first) before it reports no work.
const ATTEMPTS: usize = 3;

/// Claims one item. A claim can come back empty while work exists only when it lost a race
/// after waiting for a busy user; it then tries again, a bounded number of times.
async fn claim_one(
    client: &impl GenericClient,
    params: sql::Params<'_>,
) -> Result<Option<Row>, BrokerError> {
    for _ in 0..ATTEMPTS {
        if let Some(row) = sql::query_opt(client, CLAIM_NEXT_ITEM, params).await? {
            return Ok(Some(row));
        }
        if sql::query_opt(client, HAS_CLAIMABLE_WORK, &params[..1]).await?.is_none() {
            return Ok(None);
        }
    }
    Ok(None)
}

fn work_item(row: &Row, service: &str) -> Result<WorkItem, BrokerError> {
    Ok(WorkItem {
        id: WorkItemId(row.try_get("id")?),
        job_id: JobId(row.try_get("job_id")?),
        service: service.to_owned(),
        step: row.try_get("step_index")?,
        user: row.try_get("username")?,
        payload: row.try_get("payload")?,
        inputs: row.try_get("inputs")?,
        attempt: row.try_get("attempt")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
    })
}
