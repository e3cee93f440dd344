//! The command-line tools that talk to a running broker over its HTTP API, through
//! [`crate::client`]: `fairway admin`, `fairway submit` and `fairway worker`.

mod admin;
mod demo;
mod submit;
mod worker;

pub use admin::run as admin;
pub use demo::run as demo;
pub use submit::run as submit;
pub use worker::run as worker;

use thiserror::Error;

use crate::args::BrokerAddress;
use crate::{Client, ClientError};

#[derive(Debug, Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Input(String),
    /// The command ran, and what it found is a failure (an inconsistent recount).
    #[error("{0}")]
    Found(String),
}

fn client(broker: &BrokerAddress) -> Result<Client, CliError> {
    // `localhost:8080` parses as a URL of scheme `localhost`; reqwest would then say only
    // "builder error".
    for url in broker.url.split(',').map(str::trim) {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("http" | "https")) {
            return Err(CliError::Input(format!(
                "--url {url:?} is not an http:// or https:// URL; try http://{}",
                url.split_once("://").map_or(url, |(_, rest)| rest)
            )));
        }
    }
    // `FAIRWAY_TOKEN=` (set, but empty) sends no token rather than an empty one.
    let token = broker.token.clone().filter(|token| !token.is_empty());
    Ok(Client::trusting(&broker.url, token, broker.ca_cert.as_deref())?)
}
