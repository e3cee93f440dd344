//! Tenants and queriers as operators see them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A tenant's limits as an operator sets them.
#[derive(Debug, Clone, Copy)]
pub struct TenantLimits {
    /// Queriers serving the tenant; 0 means all.
    pub max_queriers: i32,
    /// Ready items the tenant may have waiting; 0 means no limit.
    pub max_outstanding: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantDocument {
    pub tenant: String,
    pub max_queriers: i32,
    pub max_outstanding: i32,
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
