//! fairway: a fair-queueing work broker on PostgreSQL.

pub mod auth;
pub mod bench;
pub mod broker;
pub mod chaos;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod http;
pub mod metrics;
pub mod startup;
