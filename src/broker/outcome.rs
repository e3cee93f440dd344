use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::types::Json;

use super::jobs::{apply_step_deltas, create_step_queues, StepDeltas, TenantDeltas, TenantRow};
use super::model::{reject_nul, ComponentName, ItemStatus, JobId, StatusUpdate, WorkItemId};
use super::sql::{
    self, DESCRIBE_ITEM, EXTEND_LEASE, FIND_EXPIRED_LEASES, FINISH_ITEM, INSERT_AGGREGATE_ITEM,
    INSERT_NEXT_STEP_ITEMS, LOCK_ITEM_OWNERS, PLAN_AGGREGATE_ITEM, REFRESH_JOB_STATUS,
};
use super::{Broker, BrokerError};

/// How an attempt ended, as recorded on the item.
enum Ending {
    Successful { results: Vec<Value>, component: Option<ComponentName> },
    Failed { error: Option<String>, retryable: bool },
}

/// An attempt that ended: the item's status now, its service, and whether the querier that
/// held it is shutting down (it may have released its last lease).
struct Ended {
    status: ItemStatus,
    service: String,
    querier_leaving: bool,
}

/// Whether an ending applies to any running attempt, or only to one whose lease has expired.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LeaseCondition {
    Any,
    Expired,
}

/// A worker's report that ends its attempt, as the ending batches carry it.
pub(super) struct AttemptEnding {
    id: WorkItemId,
    attempt: i32,
    ending: Ending,
}

impl Broker {
    /// Applies a worker's report on the attempt it holds, and returns the item's status after
    /// it. A stale attempt or a finished item is a conflict and changes nothing.
    ///
    /// Reports that end attempts are written together with the others that arrive meanwhile,
    /// in one transaction; the answer comes once it committed.
    pub async fn update_status(
        &self,
        id: WorkItemId,
        attempt: i32,
        update: StatusUpdate,
    ) -> Result<ItemStatus, BrokerError> {
        let ending = match update {
            StatusUpdate::Running => return self.extend_lease(id, attempt).await,
            StatusUpdate::Successful { results, component } => {
                results.iter().try_for_each(|result| reject_nul(result, "a result"))?;
                Ending::Successful { results, component }
            }
            StatusUpdate::Failed { error, retryable } => {
                if let Some(error) = &error {
                    reject_nul(&Value::String(error.clone()), "an error")?;
                }
                Ending::Failed { error, retryable }
            }
        };
        let broker = self.clone();
        let run = move |endings: Vec<AttemptEnding>| {
            let broker = broker.clone();
            async move { broker.end_in_batch(endings).await }
        };
        let ending = AttemptEnding { id, attempt, ending };
        self.endings.submit(ending, run).await.unwrap_or(Err(BrokerError::BatchLost))
    }

    /// A heartbeat touches no counter, so it needs no user lock and no batch.
    async fn extend_lease(&self, id: WorkItemId, attempt: i32) -> Result<ItemStatus, BrokerError> {
        let client = self.client().await?;
        let lease = self.lease_millis();
        if sql::query_opt(&client, EXTEND_LEASE, &[&id.0, &attempt, &lease]).await?.is_none() {
            return Err(why_not_applied(&client, id, attempt).await?);
        }
        Ok(ItemStatus::Running)
    }

    /// Ends the attempts of a batch in one transaction. Should that transaction fail, each
    /// ending is tried alone, so that it gets its own answer or error.
    async fn end_in_batch(
        &self,
        endings: Vec<AttemptEnding>,
    ) -> Vec<Result<ItemStatus, BrokerError>> {
        match self.end_batch(&endings).await {
            Ok(outcomes) => outcomes,
            Err(error) if endings.len() == 1 => vec![Err(error)],
            Err(error) => {
                tracing::warn!(%error, endings = endings.len(), "ending batch failed; ending one by one");
                let mut outcomes = Vec::with_capacity(endings.len());
                for ending in &endings {
                    outcomes.push(match self.end_batch(std::slice::from_ref(ending)).await {
                        Ok(mut outcome) => outcome.pop().unwrap_or(Err(BrokerError::BatchLost)),
                        Err(error) => Err(error),
                    });
                }
                outcomes
            }
        }
    }

    /// Every owner's users row is locked first, in the one order all transactions use, then
    /// each attempt ends; the tenant rows come last, in key order (see V2).
    async fn end_batch(
        &self,
        endings: &[AttemptEnding],
    ) -> Result<Vec<Result<ItemStatus, BrokerError>>, BrokerError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let alone = endings.len() == 1;
        if !alone {
            let ids: Vec<i64> = endings.iter().map(|ending| ending.id.0).collect();
            sql::execute(&tx, LOCK_ITEM_OWNERS, &[&ids]).await?;
        }
        let mut tenant_deltas = TenantDeltas::default();
        let mut outcomes = Vec::with_capacity(endings.len());
        let mut released = Vec::with_capacity(endings.len());
        for AttemptEnding { id, attempt, ending } in endings {
            let condition = LeaseCondition::Any;
            let ended = self
                .end_attempt(&tx, *id, *attempt, ending, condition, &mut tenant_deltas, alone)
                .await?;
            match ended {
                Some(ended) => {
                    outcomes.push(Ok(ended.status));
                    released.push(ended);
                }
                None => outcomes.push(Err(why_not_applied(&tx, *id, *attempt).await?)),
            }
        }
        tenant_deltas.apply(&tx).await?;
        tx.commit().await?;
        for ended in &released {
            // The endings are committed: what follows must not turn them into errors.
            if let Err(error) = self.after_release(ended).await {
                tracing::warn!(%error, "after an attempt ended");
            }
        }
        Ok(outcomes)
    }

    /// Treats every expired lease (up to `limit`) as a retryable failure. Safe to run in several
    /// brokers at once: an item another reaper or its worker settled first is left alone.
    /// Returns how many leases it expired.
    pub async fn reap_expired_leases(&self, limit: i64) -> Result<usize, BrokerError> {
        let expired = {
            let client = self.client().await?;
            sql::query(&client, FIND_EXPIRED_LEASES, &[&limit]).await?
        };
        let mut reaped = 0;
        for row in expired {
            let id = WorkItemId(row.try_get("id")?);
            let attempt: i32 = row.try_get("attempt")?;
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let ending =
                Ending::Failed { error: Some("lease expired".to_owned()), retryable: true };
            let mut tenant_deltas = TenantDeltas::default();
            let condition = LeaseCondition::Expired;
            if let Some(ended) = self
                .end_attempt(&tx, id, attempt, &ending, condition, &mut tenant_deltas, true)
                .await?
            {
                tenant_deltas.apply(&tx).await?;
                tx.commit().await?;
                self.after_release(&ended).await?;
                reaped += 1;
            }
        }
        Ok(reaped)
    }

    /// Records how an attempt ended, moves the counters, grows the workflow and finishes the
    /// job when nothing is left. None when the attempt is not the running one. The tenant rows'
    /// changes are left in `tenant_deltas` for the caller to apply last, except that the only
    /// ending of a transaction (`alone`) that changes one step applies its own in place.
    #[allow(clippy::too_many_arguments)]
    async fn end_attempt(
        &self,
        tx: &impl GenericClient,
        id: WorkItemId,
        attempt: i32,
        ending: &Ending,
        condition: LeaseCondition,
        tenant_deltas: &mut TenantDeltas,
        alone: bool,
    ) -> Result<Option<Ended>, BrokerError> {
        let retry_allowed = i64::from(attempt) <= i64::from(self.settings.max_retries);
        let (status, results, next_component, error) = match ending {
            Ending::Successful { results, component } => {
                (ItemStatus::Successful, Some(Json(results)), component.as_ref(), None)
            }
            Ending::Failed { error, retryable: true } if retry_allowed => {
                (ItemStatus::Ready, None, None, error.as_deref())
            }
            Ending::Failed { error, .. } => (ItemStatus::Failed, None, None, error.as_deref()),
        };
        let expired_only = condition == LeaseCondition::Expired;
        let next_component = next_component.map(ComponentName::as_str);
        let params: sql::Params =
            &[&id.0, &attempt, &status.as_str(), &results, &error, &expired_only, &next_component];
        let Some(row) = sql::query_opt(tx, FINISH_ITEM, params).await? else {
            return Ok(None);
        };
        let job_id = JobId(row.try_get("job_id")?);
        let step: i32 = row.try_get("step_index")?;
        let component: String = row.try_get("component")?;
        let results_component: String = row.try_get("results_component")?;
        let querier_leaving: bool = row.try_get("querier_leaving")?;
        let next_step_aggregates: Option<bool> = row.try_get("next_step_aggregates")?;
        let job_aggregates: bool = row.try_get("job_aggregates")?;

        let mut deltas = StepDeltas { running: -1, ..Default::default() };
        match status {
            ItemStatus::Ready => deltas.ready = 1,
            ItemStatus::Successful => deltas.successful = 1,
            _ => deltas.failed = 1,
        }
        let has_results = results.is_some_and(|Json(results)| !results.is_empty());
        let fans_out = next_step_aggregates == Some(false) && has_results;
        let may_aggregate = job_aggregates && status != ItemStatus::Ready;
        // Most endings change one step only: alone in the transaction, their tenant row is
        // then applied in place.
        let tenant_row = if alone && !fans_out && !may_aggregate {
            TenantRow::Now
        } else {
            TenantRow::Later(tenant_deltas)
        };
        let change = apply_step_deltas(tx, job_id, step, &component, deltas, tenant_row).await?;
        let service = change.service;
        let mut open_items = change.job_open_items;

        if fans_out {
            let next = step + 1;
            create_step_queues(tx, job_id, next, &[&results_component]).await?;
            let created: i32 =
                sql::query_one(tx, INSERT_NEXT_STEP_ITEMS, &[&id.0, &step]).await?.try_get(0)?;
            let ready = StepDeltas { ready: created, ..Default::default() };
            let tenant_row = TenantRow::Later(tenant_deltas);
            open_items = apply_step_deltas(tx, job_id, next, &results_component, ready, tenant_row)
                .await?
                .job_open_items;
        }
        if may_aggregate {
            if let Some(row) = sql::query_opt(tx, PLAN_AGGREGATE_ITEM, &[&job_id.0]).await? {
                let aggregate_step: i32 = row.try_get("step_index")?;
                let component: String = row.try_get("component")?;
                create_step_queues(tx, job_id, aggregate_step, &[&component]).await?;
                sql::execute(tx, INSERT_AGGREGATE_ITEM, &[&job_id.0, &aggregate_step, &component])
                    .await?;
                let ready = StepDeltas { ready: 1, ..Default::default() };
                let tenant_row = TenantRow::Later(tenant_deltas);
                open_items =
                    apply_step_deltas(tx, job_id, aggregate_step, &component, ready, tenant_row)
                        .await?
                        .job_open_items;
            }
        }
        if open_items == 0 {
            sql::execute(tx, REFRESH_JOB_STATUS, &[&job_id.0]).await?;
        }
        Ok(Some(Ended { status, service, querier_leaving }))
    }
}

impl Broker {
    /// After an attempt's end committed: wake a claim waiting for a busy user, and let a
    /// querier that is shutting down leave its shards once it holds no lease.
    async fn after_release(&self, ended: &Ended) -> Result<(), BrokerError> {
        self.signals.for_service(&ended.service).release_one();
        if ended.querier_leaving {
            self.retire_queriers().await?;
        }
        Ok(())
    }
}

fn item_not_found(id: WorkItemId) -> BrokerError {
    BrokerError::not_found("work_item_not_found", format!("no work item {id}"))
}

/// Explains why an update naming `attempt` of item `id` did not apply.
async fn why_not_applied(
    client: &impl GenericClient,
    id: WorkItemId,
    attempt: i32,
) -> Result<BrokerError, BrokerError> {
    let Some(row) = sql::query_opt(client, DESCRIBE_ITEM, &[&id.0]).await? else {
        return Ok(item_not_found(id));
    };
    let status: String = row.try_get("status")?;
    let current: i32 = row.try_get("attempt")?;
    Ok(match status.as_str() {
        "successful" | "failed" | "canceled" => BrokerError::conflict(
            "item_finished",
            format!("work item {id} is already {status}"),
        ),
        _ if current != attempt => BrokerError::conflict(
            "stale_attempt",
            format!("attempt {attempt} of work item {id} is not current (the current attempt is {current})"),
        ),
        _ => BrokerError::conflict(
            "stale_attempt",
            format!("attempt {attempt} of work item {id} no longer holds a lease"),
        ),
    })
}
