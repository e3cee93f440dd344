//! Every statement of the tenancy duty, one per `.sql` file beside it: queriers, their
//! membership, tenants and their shards.

use crate::db::sql::{row, statement};
use fairway_api::tenancy::{QuerierDocument, TenantDocument};

statement! {
    /// A row: the querier is new, and shards must be redrawn.
    JoinQuerier<'a> = "join_querier" -> () {
        querier: &'a str,
    }
}

statement! {
    TouchQuerier<'a> = "touch_querier" -> () {
        querier: &'a str,
        every_millis: i64,
    }
}

statement! {
    ShutDownQuerier<'a> = "shut_down_querier" -> () {
        querier: &'a str,
    }
}

statement! {
    NotifyQuerierShutDown<'a> = "notify_querier_shut_down" -> () {
        querier: &'a str,
    }
}

statement! {
    /// Forgets silent queriers and takes leaving ones out of their shards.
    RetireQueriers = "retire_queriers" -> Changed {
        forget_after_millis: i64,
    }
}

row! {
    Changed {
        changed: i64,
    }
}

statement! {
    /// Serialises every change of who serves which tenant.
    LockMembership = "lock_membership" -> () {}
}

statement! {
    ReshardTenants = "reshard_tenants" -> () {}
}

statement! {
    UpsertTenant<'a> = "upsert_tenant" -> () {
        tenant: &'a str,
        max_queriers: Option<i32>,
        max_outstanding: Option<i32>,
        weight: Option<i32>,
        max_running: Option<i32>,
        rate_per_second: Option<f64>,
        burst: Option<i32>,
        tier: Option<i32>,
    }
}

statement! {
    /// Every tenant, or only `tenant`.
    ListTenants<'a> = "list_tenants" -> TenantDocument {
        tenant: Option<&'a str>,
    }
}

statement! {
    ListQueriers = "list_queriers" -> QuerierDocument {
        disconnected_after_millis: i64,
    }
}

statement! {
    LockIdleTenantQueues = "lock_idle_tenant_queues" -> TenantQueueKey {}
}

row! {
    TenantQueueKey {
        service: String,
        component: String,
        tenant: String,
    }
}

statement! {
    RetireTenantQueues<'a> = "retire_tenant_queues" -> () {
        services: &'a [String],
        components: &'a [String],
        tenants: &'a [String],
    }
}
