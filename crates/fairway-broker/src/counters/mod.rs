//! The counters of the fair order, which claims, endings, jobs and promotion all move: a step's
//! item counts per component (`step_queues`), each user's claimable work (`user_work`,
//! `service_users`) and each tenant's running items (`tenant_queues`). Every change of a job's
//! items goes through [`apply_step_deltas`], and every recount and check through here.
//!
//! Three rows follow their counters by trigger rather than by a statement the Rust calls
//! (`sql/counters/`: `track_claimable_step.sql`, `lower_ready_from.sql`, `log_strategy_running.sql`);
//! each file's header says why a trigger is the only correct place.

pub mod statements;

use deadpool_postgres::GenericClient;

use crate::db::sql;
use crate::error::BrokerError;
use fairway_api::model::{JobId, Mismatch};
use statements::{
    ApplyStepDeltas, ApplyTenantDeltas, CheckConsistency, CreateStepQueues, FoldStrategyRunning,
    NotifyWorkReady, RecountTenantRunning, StepChange,
};

/// Changes to a job step's item counts, applied with `apply_step_deltas.sql`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StepDeltas {
    pub ready: i32,
    pub running: i32,
    pub successful: i32,
    pub failed: i32,
    pub canceled: i32,
    pub scheduled: i32,
}

/// The tenant_queues side of a transaction's step changes, gathered by `apply_step_deltas` and
/// applied once, last and in key order, so that no two transactions wait for each other's
/// tenant rows. A transaction with a single step change has it applied in place instead
/// (`TenantRow::Now`), which saves a round trip.
#[derive(Debug, Default)]
pub(crate) struct TenantDeltas {
    services: Vec<String>,
    components: Vec<String>,
    tenants: Vec<String>,
    running: Vec<i32>,
    activate: Vec<bool>,
}

/// Where a step change's tenant row goes.
pub(crate) enum TenantRow<'a> {
    /// The transaction's only step change: apply it with the step.
    Now,
    /// One of several: gather it, for `TenantDeltas::apply` at the end.
    Later(&'a mut TenantDeltas),
}

impl TenantDeltas {
    pub(crate) fn push(
        &mut self,
        service: String,
        component: String,
        tenant: String,
        running: i32,
        activate: bool,
    ) {
        self.services.push(service);
        self.components.push(component);
        self.tenants.push(tenant);
        self.running.push(running);
        self.activate.push(activate);
    }

    pub(crate) async fn apply(self, tx: &impl GenericClient) -> Result<(), BrokerError> {
        if self.services.is_empty() {
            return Ok(());
        }
        let deltas = ApplyTenantDeltas {
            services: &self.services,
            components: &self.components,
            tenants: &self.tenants,
            running: &self.running,
            activate: &self.activate,
        };
        sql::run(tx, &deltas).await?;
        Ok(())
    }
}

/// Moves the counts of a step's items of one component (and the user's fair-order rows with
/// them), and wakes waiting workers when the user's work for the service became claimable. The
/// caller holds the user's row lock. Returns how many items of the whole job are still ready or
/// running.
pub(crate) async fn apply_step_deltas(
    tx: &impl GenericClient,
    job_id: JobId,
    step: i32,
    component: &str,
    deltas: StepDeltas,
    tenant_row: TenantRow<'_>,
) -> Result<i32, BrokerError> {
    let tenant_now = matches!(tenant_row, TenantRow::Now);
    let change = ApplyStepDeltas {
        job_id: job_id.0,
        step,
        component,
        ready: deltas.ready,
        running: deltas.running,
        successful: deltas.successful,
        failed: deltas.failed,
        canceled: deltas.canceled,
        scheduled: deltas.scheduled,
        tenant_now,
    };
    let StepChange {
        service: Some(service),
        tenant: Some(tenant),
        became_claimable: Some(became_claimable),
        job_open_items: Some(job_open_items),
    } = sql::fetch_one(tx, &change).await?
    else {
        return Err(BrokerError::not_found(
            "step_not_found",
            format!("job {job_id} has no step {step} with items of component {component}"),
        ));
    };
    if became_claimable {
        notify_work_ready(tx, &service).await?;
    }
    if let TenantRow::Later(tenant_deltas) = tenant_row {
        tenant_deltas.push(service, component.to_owned(), tenant, deltas.running, became_claimable);
    }
    Ok(job_open_items)
}

/// Makes sure a step has its counter rows for each of `components` (sorted, distinct).
pub(crate) async fn create_step_queues(
    tx: &impl GenericClient,
    job_id: JobId,
    step: i32,
    components: &[&str],
) -> Result<(), BrokerError> {
    sql::run(tx, &CreateStepQueues { job_id: job_id.0, step, components }).await?;
    Ok(())
}

/// Brings the tenant rows' running counts back to a count of the running items.
pub(crate) async fn recount_tenant_running(client: &impl GenericClient) -> Result<(), BrokerError> {
    sql::run(client, &RecountTenantRunning {}).await?;
    Ok(())
}

/// Folds the strategies' logged running-count changes into their rows (those free now).
pub(crate) async fn fold_strategy_running(client: &impl GenericClient) -> Result<(), BrokerError> {
    sql::run(client, &FoldStrategyRunning {}).await?;
    Ok(())
}

/// Every counter that differs from a recount of the items it counts.
pub(crate) async fn check_consistency(
    client: &impl GenericClient,
) -> Result<Vec<Mismatch>, BrokerError> {
    Ok(sql::fetch_all(client, &CheckConsistency {}).await?)
}

/// Wakes the workers of `service` that wait in a long poll, on every broker, at commit.
pub(crate) async fn notify_work_ready(
    client: &impl GenericClient,
    service: &str,
) -> Result<(), BrokerError> {
    sql::run(client, &NotifyWorkReady { service }).await?;
    Ok(())
}
