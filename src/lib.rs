//! fairway: a fair-queueing work broker on PostgreSQL.

pub mod bench;
pub mod broker;
pub mod config;
pub mod db;
pub mod http;
pub mod startup;
