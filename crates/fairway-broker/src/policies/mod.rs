//! Policies operators set: today a service's cap on its running items and its rate limit.
//! Claims enforce them in their own transaction (`claims/functions/admit_services.sql`); this
//! duty reads and writes them.

pub mod statements;

use std::sync::Arc;

use crate::core::Core;
use crate::db::sql;
use crate::BrokerError;
use fairway_api::model::ServiceName;
use fairway_api::policy::{ServicePolicyChange, ServicePolicyDocument};
use statements::{ServicePolicyOf, ServicePolicyRow, SetServicePolicy};

/// Reads and sets the policies.
#[derive(Clone)]
pub struct Policies {
    core: Arc<Core>,
}

impl Policies {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// A service's policy and its items running now; 404 for a service no job has named and
    /// no policy names.
    pub async fn service(
        &self,
        service: &ServiceName,
    ) -> Result<ServicePolicyDocument, BrokerError> {
        let client = self.core.client().await?;
        let row = sql::fetch_one(&client, &ServicePolicyOf { service: service.as_str() }).await?;
        if !row.known {
            return Err(BrokerError::not_found(
                "service_not_found",
                format!("no job names service {} and it has no policy", service.as_str()),
            ));
        }
        Ok(document(row))
    }

    /// Changes a service's policy, the fields left out kept, for a service not yet seen too,
    /// so that operators can set it before work arrives. Claims obey it from their next batch.
    pub async fn set_service(
        &self,
        service: &ServiceName,
        change: ServicePolicyChange,
    ) -> Result<ServicePolicyDocument, BrokerError> {
        let client = self.core.client().await?;
        let set = SetServicePolicy {
            service: service.as_str(),
            max_running: change.max_running,
            rate_per_second: change.rate_per_second,
            burst: change.burst,
        };
        sql::run(&client, &set).await?;
        let row = sql::fetch_one(&client, &ServicePolicyOf { service: service.as_str() }).await?;
        Ok(document(row))
    }
}

fn document(row: ServicePolicyRow) -> ServicePolicyDocument {
    ServicePolicyDocument {
        service: row.service,
        max_running: row.max_running,
        rate_per_second: row.rate_per_second,
        burst: row.burst,
        running: row.running,
    }
}
