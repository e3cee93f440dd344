//! Which build a broker is, and what its database holds: what an operator compares across
//! brokers during an upgrade.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A broker's build: `GET /admin/version`, and `fairway --version` in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionDocument {
    /// The release, as `fairway --version` prints it.
    pub version: String,
    /// The revision of the server functions this broker carries.
    pub functions_revision: i32,
    /// The schema this broker's server functions live in, which its connections search first.
    pub functions_schema: String,
    /// The last schema migration this broker carries, as `V<n>__<name>`.
    pub schema_migration: String,
    /// What the database holds now.
    pub database: InstalledDocument,
}

/// What a database holds of the schema: its last migration (none where no broker migrated it
/// yet), and every set of server functions brokers installed, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstalledDocument {
    pub schema_migration: Option<String>,
    pub function_sets: Vec<FunctionSetDocument>,
}

/// One set of server functions in the database: brokers of one build call it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FunctionSetDocument {
    pub schema: String,
    pub revision: i32,
    /// The release of the broker that last used the set.
    pub version: String,
    pub installed_at: DateTime<Utc>,
    /// When a broker last marked the set as in use; a set unused for
    /// `--function-set-retention` is dropped.
    pub last_used_at: DateTime<Utc>,
    /// Whether the tables' trigger bindings call this set's functions: the newest set's do.
    pub owns_triggers: bool,
}
