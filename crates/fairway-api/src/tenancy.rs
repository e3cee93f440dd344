//! Tenants and queriers as operators see them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::{self, PolicyChange, PolicyOf};
use crate::Invalid;

/// A change to a tenant's limits and policy, as `PUT /admin/tenants/{tenant}` reads it: the
/// fields given, the rest kept as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TenantChange {
    /// Queriers serving the tenant; 0 means all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queriers: Option<i32>,
    /// Ready items the tenant may have waiting; 0 means no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_outstanding: Option<i32>,
    #[serde(flatten)]
    pub policy: PolicyChange,
}

impl TenantChange {
    /// Reads the body; every error names the field at fault, and an unknown field is an error.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        let mut change = Self::default();
        for (key, value) in policy::object(value, PolicyOf::Tenant)? {
            let limit = || policy::integer(value, key, 0, i64::from(i32::MAX));
            match key.as_str() {
                "max_queriers" => change.max_queriers = Some(limit()?),
                "max_outstanding" => change.max_outstanding = Some(limit()?),
                _ if change.policy.read(key, value, PolicyOf::Tenant)? => {}
                _ => return Err(policy::unknown(key, PolicyOf::Tenant)),
            }
        }
        Ok(change)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantDocument {
    pub tenant: String,
    pub max_queriers: i32,
    pub max_outstanding: i32,
    /// The tenant's share of the workers against other tenants', per component: 1 to 1000.
    pub weight: i32,
    /// The tenant's tier, 1 to 5: within a component, a lower tier is served first.
    pub tier: i32,
    /// Most items of the tenant running at once over every broker and service; 0: no cap.
    pub max_running: i32,
    /// Items handed out per second over every broker; 0: no limit.
    pub rate_per_second: f64,
    /// Items handed out at once after a quiet spell.
    pub burst: i32,
    /// The tenant's items running now, over every service.
    pub running: i64,
    /// Whether the tenant is at its cap: claims pass it over until an item of it ends.
    pub at_cap: bool,
    /// When the tenant's next item is due, while its rate limit's bucket is empty.
    pub throttled_until: Option<DateTime<Utc>>,
    /// Whether only `queriers` serve it (false: every querier does).
    pub sharded: bool,
    /// Ready items waiting.
    pub outstanding: i64,
    /// The queriers that serve it now.
    pub queriers: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuerierDocument {
    pub querier: String,
    /// `active`, `shutting_down`, or `disconnected` (no request for half the forget delay).
    pub state: String,
    /// Whether shards are drawn from it.
    pub in_shards: bool,
    pub joined_at: DateTime<Utc>,
    pub last_request_at: DateTime<Utc>,
    pub leases: i64,
    /// The sharded tenants whose shard holds it (unsharded tenants are served by all).
    pub tenants: Vec<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tenant_change_reads_its_limits_and_policy_and_writes_them_back() {
        let body = json!({"max_queriers": 2, "weight": 3, "rate_per_second": 1.5});
        let change = TenantChange::parse(&body).expect("valid");
        assert_eq!(change.max_queriers, Some(2));
        assert_eq!(change.max_outstanding, None);
        assert_eq!((change.policy.weight, change.policy.rate_per_second), (Some(3), Some(1.5)));
        assert_eq!(serde_json::to_value(change).expect("JSON"), body);
        for (body, field) in [
            (json!({"max_outstanding": -1}), "max_outstanding"),
            (json!({"weight": 0}), "weight"),
            (json!({"shards": 2}), "shards"),
        ] {
            let refused = TenantChange::parse(&body).expect_err("refused");
            assert!(refused.message.starts_with(&format!("{field}: ")), "{}", refused.message);
        }
    }
}
