//! Queriers, tenants and their shards: who may serve whom. All of it lives in the database, so
//! every broker process decides claims from the same membership.

pub mod statements;

use std::sync::Arc;

use deadpool_postgres::GenericClient;

use crate::core::Core;
use crate::counters;
use crate::db::sql;
use crate::error::BrokerError;
use fairway_api::model::{QuerierName, TenantName};
use fairway_api::tenancy::{QuerierDocument, TenantChange, TenantDocument};
use statements::{
    JoinQuerier, ListQueriers, ListTenants, LockIdleTenantQueues, LockMembership,
    NotifyQuerierShutDown, ReshardTenants, RetireQueriers, RetireTenantQueues, ShutDownQuerier,
    TouchQuerier, UpsertTenant,
};

/// Queriers, tenants and their shards.
#[derive(Clone)]
pub struct Tenancy {
    core: Arc<Core>,
}

impl Tenancy {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

impl Tenancy {
    /// A querier's first work request makes it a member, and redraws the shards.
    pub(crate) async fn join_querier(&self, querier: &str) -> Result<(), BrokerError> {
        self.core.retrying("join_querier", move || self.join_querier_once(querier)).await
    }

    async fn join_querier_once(&self, querier: &str) -> Result<(), BrokerError> {
        let mut client = self.core.client().await?;
        let tx = membership_change(&mut client).await?;
        let joined = sql::fetch_opt(&tx, &JoinQuerier { querier }).await?.is_some();
        commit_membership_change(tx, joined).await
    }

    /// Records that the querier is still there: a waiting long poll counts as a request.
    pub(crate) async fn touch(&self, querier: &str) -> Result<(), BrokerError> {
        let client = self.core.client().await?;
        let touch = TouchQuerier { querier, every_millis: self.core.touch_every_millis() };
        sql::run(&client, &touch).await?;
        Ok(())
    }

    /// A querier announced its shutdown: its further work requests get 410, it leaves its
    /// shards once it holds no lease, and it is forgotten once it holds none and has not been
    /// heard for the forget delay (its 410s do not count). A querier never seen, or forgotten,
    /// is not found: shutting it down would block its name in advance.
    pub async fn shut_down_querier(&self, querier: &QuerierName) -> Result<(), BrokerError> {
        self.core.retrying("shut_down_querier", move || self.shut_down_querier_once(querier)).await
    }

    async fn shut_down_querier_once(&self, querier: &QuerierName) -> Result<(), BrokerError> {
        let mut client = self.core.client().await?;
        let tx = membership_change(&mut client).await?;
        let shut_down = ShutDownQuerier { querier: querier.as_str() };
        if sql::fetch_opt(&tx, &shut_down).await?.is_none() {
            return Err(BrokerError::not_found(
                "querier_not_found",
                format!(
                    "no querier {}: it never asked for work, or was forgotten after the forget \
                     delay without a request",
                    querier.as_str()
                ),
            ));
        }
        sql::run(&tx, &NotifyQuerierShutDown { querier: querier.as_str() }).await?;
        let changed = retire(&tx, self.forget_after_millis()).await?;
        commit_membership_change(tx, changed).await
    }

    /// Retires queriers that shut down and hold no lease, forgets silent ones, and redraws
    /// shards when anything changed. Run by the reaper and after a release.
    pub async fn retire_queriers(&self) -> Result<(), BrokerError> {
        self.core.retrying("retire_queriers", move || self.retire_queriers_once()).await
    }

    async fn retire_queriers_once(&self) -> Result<(), BrokerError> {
        let mut client = self.core.client().await?;
        let tx = membership_change(&mut client).await?;
        let changed = retire(&tx, self.forget_after_millis()).await?;
        commit_membership_change(tx, changed).await
    }

    fn forget_after_millis(&self) -> i64 {
        sql::millis(self.core.settings.querier_forget_delay)
    }

    /// Changes a tenant's limits and policy (creating it), the fields left out kept, and
    /// redraws the shards. Claims obey a new policy from their next batch.
    pub async fn set_tenant(
        &self,
        tenant: &TenantName,
        change: TenantChange,
    ) -> Result<TenantDocument, BrokerError> {
        self.core.retrying("set_tenant", move || self.set_tenant_once(tenant, change)).await
    }

    async fn set_tenant_once(
        &self,
        tenant: &TenantName,
        change: TenantChange,
    ) -> Result<TenantDocument, BrokerError> {
        let mut client = self.core.client().await?;
        let tx = membership_change(&mut client).await?;
        let upsert = UpsertTenant {
            tenant: tenant.as_str(),
            max_queriers: change.max_queriers,
            max_outstanding: change.max_outstanding,
            weight: change.policy.weight,
            max_running: change.policy.max_running,
            rate_per_second: change.policy.rate_per_second,
            burst: change.policy.burst,
            tier: change.policy.tier,
        };
        sql::run(&tx, &upsert).await?;
        sql::run(&tx, &ReshardTenants {}).await?;
        let document = read_tenants(&tx, Some(tenant.as_str())).await?.pop();
        tx.commit().await?;
        document.ok_or_else(|| tenant_not_found(tenant.as_str()))
    }

    pub async fn tenant(&self, tenant: &TenantName) -> Result<TenantDocument, BrokerError> {
        let client = self.core.client().await?;
        read_tenants(&client, Some(tenant.as_str()))
            .await?
            .pop()
            .ok_or_else(|| tenant_not_found(tenant.as_str()))
    }

    pub async fn tenants(&self) -> Result<Vec<TenantDocument>, BrokerError> {
        let client = self.core.client().await?;
        read_tenants(&client, None).await
    }

    pub async fn queriers(&self) -> Result<Vec<QuerierDocument>, BrokerError> {
        let client = self.core.client().await?;
        let list = ListQueriers { disconnected_after_millis: self.forget_after_millis() / 2 };
        Ok(sql::fetch_all(&client, &list).await?)
    }

    /// Keeps the tenant level of the fair order tidy: retires tenant queues with nothing
    /// claimable (so claims do not step over them), and recounts the running hints.
    pub async fn tidy_tenant_queues(&self) -> Result<(), BrokerError> {
        self.core.retrying("tidy_tenant_queues", move || self.tidy_tenant_queues_once()).await
    }

    async fn tidy_tenant_queues_once(&self) -> Result<(), BrokerError> {
        let mut client = self.core.client().await?;
        let tx = client.transaction().await?;
        let idle = sql::fetch_all(&tx, &LockIdleTenantQueues {}).await?;
        if !idle.is_empty() {
            let (mut services, mut components, mut tenants) = (Vec::new(), Vec::new(), Vec::new());
            for queue in idle {
                services.push(queue.service);
                components.push(queue.component);
                tenants.push(queue.tenant);
            }
            let retire = RetireTenantQueues {
                services: &services,
                components: &components,
                tenants: &tenants,
            };
            sql::run(&tx, &retire).await?;
        }
        tx.commit().await?;
        counters::recount_tenant_running(&client).await?;
        Ok(())
    }
}

/// Starts a transaction holding the membership lock.
async fn membership_change(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, BrokerError> {
    let tx = client.transaction().await?;
    sql::fetch_all(&tx, &LockMembership {}).await?;
    Ok(tx)
}

/// Redraws every shard when membership changed, and commits.
async fn commit_membership_change(
    tx: deadpool_postgres::Transaction<'_>,
    changed: bool,
) -> Result<(), BrokerError> {
    if changed {
        sql::run(&tx, &ReshardTenants {}).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn retire(tx: &impl GenericClient, forget_after: i64) -> Result<bool, BrokerError> {
    let retire = RetireQueriers { forget_after_millis: forget_after };
    Ok(sql::fetch_one(tx, &retire).await?.changed > 0)
}

fn tenant_not_found(tenant: &str) -> BrokerError {
    BrokerError::not_found("tenant_not_found", format!("no tenant {tenant}"))
}

async fn read_tenants(
    client: &impl GenericClient,
    tenant: Option<&str>,
) -> Result<Vec<TenantDocument>, BrokerError> {
    Ok(sql::fetch_all(client, &ListTenants { tenant }).await?)
}
