//! API tests against a real PostgreSQL, one module per capability.

mod auth;
mod batches;
mod cli;
mod concurrency;
mod contract;
mod dashboard;
#[cfg(feature = "fault-injection")]
mod deadlocks;
mod deploy;
mod disconnects;
mod failover;
mod fairness;
mod helpers;
mod idempotency;
mod leases;
mod lifecycle;
mod longpoll;
mod metrics;
mod operators;
mod pgtap;
mod plans;
mod pruning;
mod releases;
mod repeats;
mod results;
mod retries;
mod scheduled;
mod schema;
mod shutdown;
mod strategies;
mod tenants;
mod tls;
mod traces;
mod validation;
mod workflow;
mod workspace;
