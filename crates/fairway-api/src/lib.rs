//! fairway's wire types: ids and names, the bodies of jobs, claims and status updates, claim
//! strategies, the documents and pages the API answers with, and their validation. Everything
//! here parses once at the boundary; it knows neither HTTP nor PostgreSQL.

pub mod build;
mod error;
pub mod model;
pub mod pages;
pub mod policy;
pub mod retry;
pub mod strategy;
pub mod summary;
pub mod tenancy;
pub mod tokens;
pub mod traceparent;

pub use error::Invalid;

use std::time::Duration;

/// A duration greater than zero, such as `1m` or `500ms`.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be greater than zero".to_owned()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}
