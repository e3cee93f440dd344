//! Policies operators set on users and services: a user's weight, and caps on running items and
//! rate limits for both. (A tenant's policy is set with its limits, by tenancy.) Claims enforce
//! them in their own transaction (`sql/claims/`); this duty reads and writes them.

pub mod statements;

use std::sync::Arc;

use crate::core::Core;
use crate::db::sql;
use crate::error::BrokerError;
use fairway_api::model::{ServiceName, UserName};
use fairway_api::policy::{PolicyChange, ServicePolicyDocument, UserPolicyDocument};
use statements::{
    ServicePolicyOf, ServicePolicyRow, SetServicePolicy, SetUserPolicy, UserPolicyOf, UserPolicyRow,
};

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
        change: PolicyChange,
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

impl Policies {
    /// A user's policy and its items running now; 404 for a user with neither work nor a
    /// policy.
    pub async fn user(&self, user: &UserName) -> Result<UserPolicyDocument, BrokerError> {
        let client = self.core.client().await?;
        let row = sql::fetch_opt(&client, &UserPolicyOf { username: user.as_str() }).await?;
        row.map(user_document).ok_or_else(|| {
            BrokerError::not_found(
                "user_not_found",
                format!("user {} has no work and no policy", user.as_str()),
            )
        })
    }

    /// Changes a user's policy, the fields left out kept, for a user not yet seen too, so that
    /// operators can set a weight before work arrives. Claims obey it from their next batch.
    pub async fn set_user(
        &self,
        user: &UserName,
        change: PolicyChange,
    ) -> Result<UserPolicyDocument, BrokerError> {
        let client = self.core.client().await?;
        let set = SetUserPolicy {
            username: user.as_str(),
            weight: change.weight,
            max_running: change.max_running,
            rate_per_second: change.rate_per_second,
            burst: change.burst,
            tier: change.tier,
        };
        sql::run(&client, &set).await?;
        self.user(user).await
    }
}

fn user_document(row: UserPolicyRow) -> UserPolicyDocument {
    UserPolicyDocument {
        user: row.username,
        weight: row.weight,
        tier: row.tier,
        max_running: row.max_running,
        rate_per_second: row.rate_per_second,
        burst: row.burst,
        running: row.running,
        at_cap: row.at_cap,
        throttled_until: row.throttled_until,
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
