//! Bearer tokens as the API shows them: a token's role and its record, never its secret.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, the token routes included.
    Admin,
    /// Every GET of the producers' and the admin routes (the dashboard's, `fairway admin`'s
    /// listings); changes nothing.
    Reader,
    /// Submits, reads, pauses, resumes and cancels jobs; optionally of some tenants only.
    Producer,
    /// Claims, heartbeats and reports; optionally of some services only, and only on the items
    /// it claimed itself.
    Worker,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Reader, Role::Producer, Role::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Reader => "reader",
            Self::Producer => "producer",
            Self::Worker => "worker",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == text)
    }
}

/// A token as the database holds it, without its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenDocument {
    pub id: i64,
    pub name: String,
    pub role: Role,
    /// The tenants a producer token may touch; absent: every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// The services a worker token may claim; absent: every service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Within a minute or so: brokers write it at most once a minute each.
    pub last_used_at: Option<DateTime<Utc>>,
}

impl TokenDocument {
    /// Whether it can be used now: neither revoked nor expired.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}
