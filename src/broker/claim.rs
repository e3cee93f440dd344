use std::pin::pin;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::model::{ClaimRequest, JobId, WorkItem, WorkItemId};
use super::sql::{self, CLAIM_NEXT_ITEM, HAS_CLAIMABLE_WORK};
use super::{Broker, BrokerError};

/// How long a claim that found every user with work busy waits for a release signalled in
/// this process before it looks again anyway (other brokers' releases are not signalled here).
const RELEASE_POLL: Duration = Duration::from_millis(50);

/// How long a claim keeps waiting for busy users before it reports no work.
const CONTENDED_LIMIT: Duration = Duration::from_secs(5);

/// How many times a claim looks again, at once, after choosing a user whose place in the order
/// had changed since its snapshot, before it waits like a contended claim.
const STALE_RETRIES: usize = 4;

/// What one look for work found.
enum Look {
    Claimed(Vec<WorkItem>),
    /// Work exists, but every user who has it is held by another transaction right now.
    Contended,
    Nothing,
    /// The querier has not joined yet: nothing was looked at.
    NotMember,
}

/// What one claim statement did.
enum Claim {
    Item(Box<WorkItem>),
    Nothing,
    NotMember,
}

impl Broker {
    /// Hands out up to `request.max` work items of the service in one transaction, each chosen
    /// by the fair order as a single claim would choose it. Empty when nothing is ready.
    ///
    /// When every user with work is being served by other claims (a lone user and many workers),
    /// the claim waits here for one of them to be released rather than answer "no work", and
    /// rather than queue inside PostgreSQL on a row lock while holding a connection.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Vec<WorkItem>, BrokerError> {
        let signal = self.signals.for_service(request.service.as_str());
        let deadline = Instant::now() + CONTENDED_LIMIT;
        loop {
            let mut released = pin!(signal.released());
            released.as_mut().enable();
            match self.look_for_work(request).await? {
                Look::Claimed(items) => {
                    signal.release_one();
                    return Ok(items);
                }
                Look::Nothing => return Ok(Vec::new()),
                Look::NotMember => self.join_querier(request.querier.as_str()).await?,
                Look::Contended if Instant::now() >= deadline => return Ok(Vec::new()),
                Look::Contended => {
                    let _ = tokio::time::timeout(RELEASE_POLL, released).await;
                }
            }
        }
    }

    async fn look_for_work(&self, request: &ClaimRequest) -> Result<Look, BrokerError> {
        let mut client = self.client().await?;
        let service = request.service.as_str();
        let lease = self.lease_millis();
        let querier = request.querier.as_str();
        let touch_every = self.touch_every_millis();
        // Only the first claim of a transaction may wait for its tenant's row (see the claim
        // function): a batch then never holds one tenant row while waiting for another.
        let params = |may_wait: &'static bool| -> [&(dyn ToSql + Sync); 6] {
            [&service, &querier, &request.worker, &lease, &touch_every, may_wait]
        };
        let items = if request.max == 1 {
            // The common case is one statement: let it commit on its own, without BEGIN/COMMIT.
            match claim_one(&client, &params(&true), querier, service).await? {
                Claim::Item(item) => vec![*item],
                Claim::Nothing => Vec::new(),
                Claim::NotMember => return Ok(Look::NotMember),
            }
        } else {
            let tx = client.transaction().await?;
            let mut items = Vec::with_capacity(request.max);
            while items.len() < request.max {
                let may_wait = if items.is_empty() { &true } else { &false };
                match claim_one(&tx, &params(may_wait), querier, service).await? {
                    Claim::Item(item) => items.push(*item),
                    Claim::Nothing => break,
                    Claim::NotMember => return Ok(Look::NotMember),
                }
            }
            tx.commit().await?;
            items
        };
        if !items.is_empty() {
            return Ok(Look::Claimed(items));
        }
        Ok(match sql::query_opt(&client, HAS_CLAIMABLE_WORK, &[&service, &querier]).await? {
            Some(_) => Look::Contended,
            None => Look::Nothing,
        })
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
            // A waiting querier is still there: its last_seen keeps moving while it waits, so
            // that it neither looks disconnected nor is forgotten in the middle of a long poll.
            let touch_every = Duration::from_millis(self.touch_every_millis().unsigned_abs());
            loop {
                let until = deadline.min(Instant::now() + touch_every);
                if tokio::time::timeout_at(until, notified.as_mut()).await.is_ok() {
                    break;
                }
                self.touch(request.querier.as_str()).await?;
                if Instant::now() >= deadline {
                    return Ok(items);
                }
            }
        }
    }
}

/// One claim statement, looked at again at once while the user it chose turns out stale.
async fn claim_one(
    client: &impl GenericClient,
    params: sql::Params<'_>,
    querier: &str,
    service: &str,
) -> Result<Claim, BrokerError> {
    for _ in 0..STALE_RETRIES {
        let row = sql::query_one(client, CLAIM_NEXT_ITEM, params).await?;
        match row.try_get::<_, Option<&str>>("querier_state")? {
            None => return Ok(Claim::NotMember),
            Some("shutting_down") => {
                return Err(BrokerError::QuerierShuttingDown(querier.to_owned()))
            }
            Some(_) => {}
        }
        if row.try_get::<_, Option<&str>>("username")?.is_none() {
            return Ok(Claim::Nothing);
        }
        // Not stale and still no item: the user's last ready item went to a cancel or another
        // claim in between; looking again is the answer too.
        if !row.try_get::<_, bool>("stale")? && row.try_get::<_, Option<i64>>("id")?.is_some() {
            return Ok(Claim::Item(Box::new(work_item(&row, service)?)));
        }
    }
    Ok(Claim::Nothing)
}

fn work_item(row: &Row, service: &str) -> Result<WorkItem, BrokerError> {
    Ok(WorkItem {
        id: WorkItemId(row.try_get("id")?),
        job_id: JobId(row.try_get("job_id")?),
        service: service.to_owned(),
        step: row.try_get("step_index")?,
        user: row.try_get("username")?,
        tenant: row.try_get("tenant")?,
        actor: row.try_get("actor")?,
        component: row.try_get("component")?,
        payload: row.try_get("payload")?,
        inputs: row.try_get("inputs")?,
        attempt: row.try_get("attempt")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
    })
}
