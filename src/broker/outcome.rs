use deadpool_postgres::GenericClient;
use serde_json::Value;

use super::jobs::{apply_step_deltas, create_step_queues, StepDeltas, TenantDeltas, TenantRow};
use super::model::{reject_nul, ComponentName, ItemStatus, JobId, StatusUpdate, WorkItemId};
use super::sql::{
    self, DESCRIBE_ITEM, EXTEND_LEASE, FIND_EXPIRED_LEASES, FINISH_ITEM, INSERT_AGGREGATE_ITEM,
    INSERT_NEXT_STEP_ITEMS, PLAN_AGGREGATE_ITEM, REFRESH_JOB_STATUS,
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

impl Broker {
    /// Applies a worker's report on the attempt it holds, and returns the item's status after
    /// it. A stale attempt or a finished item is a conflict and changes nothing.
    pub async fn update_status(
        &self,
        id: WorkItemId,
        attempt: i32,
        update: StatusUpdate,
    ) -> Result<ItemStatus, BrokerError> {
        match &update {
            StatusUpdate::Successful { results, .. } => {
                results.iter().try_for_each(|result| reject_nul(result, "a result"))?;
            }
            StatusUpdate::Failed { error: Some(error), .. } => {
                reject_nul(&Value::String(error.clone()), "an error")?;
            }
            _ => {}
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let ending = match update {
            // A heartbeat touches no counter, so it needs no user lock.
            StatusUpdate::Running => {
                let lease = self.lease_millis();
                let extended =
                    sql::query_opt(&tx, EXTEND_LEASE, &[&id.0, &attempt, &lease]).await?;
                if extended.is_none() {
                    return Err(why_not_applied(&tx, id, attempt).await?);
                }
                tx.commit().await?;
                return Ok(ItemStatus::Running);
            }
            StatusUpdate::Successful { results, component } => {
                Ending::Successful { results, component }
            }
            StatusUpdate::Failed { error, retryable } => Ending::Failed { error, retryable },
        };
        match self.end_attempt(&tx, id, attempt, ending, LeaseCondition::Any).await? {
            Some(ended) => {
                tx.commit().await?;
                self.after_release(&ended).await?;
                Ok(ended.status)
            }
            None => Err(why_not_applied(&tx, id, attempt).await?),
        }
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
            if let Some(ended) =
                self.end_attempt(&tx, id, attempt, ending, LeaseCondition::Expired).await?
            {
                tx.commit().await?;
                self.after_release(&ended).await?;
                reaped += 1;
            }
        }
        Ok(reaped)
    }

    /// Records how an attempt ended, moves the counters, grows the workflow and finishes the
    /// job when nothing is left. None when the attempt is not the running one.
    async fn end_attempt(
        &self,
        tx: &impl GenericClient,
        id: WorkItemId,
        attempt: i32,
        ending: Ending,
        condition: LeaseCondition,
    ) -> Result<Option<Ended>, BrokerError> {
        let retry_allowed = i64::from(attempt) <= i64::from(self.settings.max_retries);
        let (status, results, next_component, error) = match ending {
            Ending::Successful { results, component } => {
                (ItemStatus::Successful, Some(Value::Array(results)), component, None)
            }
            Ending::Failed { error, retryable: true } if retry_allowed => {
                (ItemStatus::Ready, None, None, error)
            }
            Ending::Failed { error, .. } => (ItemStatus::Failed, None, None, error),
        };
        let expired_only = condition == LeaseCondition::Expired;
        let next_component = next_component.as_ref().map(ComponentName::as_str);
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
        let has_results = matches!(&results, Some(Value::Array(results)) if !results.is_empty());
        let fans_out = next_step_aggregates == Some(false) && has_results;
        let may_aggregate = job_aggregates && status != ItemStatus::Ready;
        let mut tenant_deltas = TenantDeltas::default();
        // Most endings change one step only: their tenant row is then applied in place.
        let tenant_row = if fans_out || may_aggregate {
            TenantRow::Later(&mut tenant_deltas)
        } else {
            TenantRow::Now
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
            let tenant_row = TenantRow::Later(&mut tenant_deltas);
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
                let tenant_row = TenantRow::Later(&mut tenant_deltas);
                open_items =
                    apply_step_deltas(tx, job_id, aggregate_step, &component, ready, tenant_row)
                        .await?
                        .job_open_items;
            }
        }
        tenant_deltas.apply(tx).await?;
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
