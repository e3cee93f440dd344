pub mod config;
pub mod db;
