use std::pin::pin;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::time::Instant;
use tokio_postgres::Row;

use super::model::{ClaimRequest, JobId, WorkItem, WorkItemId};
use super::sql::{self, CLAIM_NEXT_ITEM, LOCK_BEST_READY_USER};
use super::{Broker, BrokerError};

impl Broker {
    /// Hands out up to `request.max` work items of the service in one transaction, each chosen
    /// by the fair order as a single claim would choose it. Empty when nothing is ready.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Vec<WorkItem>, BrokerError> {
        let mut client = self.client().await?;
        let service = request.service.as_str();
        let lease = self.lease_millis();
        let params: sql::Params = &[&service, &request.querier.as_str(), &request.worker, &lease];
        if request.max == 1 {
            // The common case is one statement: let it commit on its own, without BEGIN/COMMIT.
            if let Some(row) = sql::query_opt(&client, CLAIM_NEXT_ITEM, params).await? {
                return Ok(vec![work_item(&row, service)?]);
            }
        }
        let tx = client.transaction().await?;

        let mut items = Vec::with_capacity(request.max);
        while items.len() < request.max {
            match claim_one(&tx, params, items.is_empty()).await? {
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

/// How often a claim that keeps losing races retries before it reports no work.
const CONTENDED_ATTEMPTS: usize = 3;

/// Claims one item. With `wait_if_contended`, a claim that found every user with claimable work
/// held by concurrent claims (a lone user and many workers) queues behind the best of them
/// rather than answering "no work" while work exists.
async fn claim_one(
    tx: &impl GenericClient,
    params: sql::Params<'_>,
    wait_if_contended: bool,
) -> Result<Option<Row>, BrokerError> {
    let service = params[0];
    for _ in 0..CONTENDED_ATTEMPTS {
        if let Some(row) = sql::query_opt(tx, CLAIM_NEXT_ITEM, params).await? {
            return Ok(Some(row));
        }
        if !wait_if_contended
            || sql::query_opt(tx, LOCK_BEST_READY_USER, &[service]).await?.is_none()
        {
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
