//! Which build a broker is, and what its database holds: what an operator compares across
//! brokers during an upgrade.

use serde::{Deserialize, Serialize};

/// A broker's build: `GET /admin/version`, and `fairway --version` in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionDocument {
    /// The release, as `fairway --version` prints it.
    pub version: String,
    /// The revision of the server functions this broker carries.
    pub functions_revision: i32,
    /// The last schema migration this broker carries, as `V<n>__<name>`.
    pub schema_migration: String,
    /// What the database holds now.
    pub database: InstalledDocument,
}

/// What a database holds of the schema: none where no broker installed it yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstalledDocument {
    pub functions_revision: Option<i32>,
    pub schema_migration: Option<String>,
}
