//! How fairway reaches PostgreSQL. A connection string is read as libpq reads it, TLS settings
//! included (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`), which tokio-postgres alone refuses;
//! the result is a tokio-postgres configuration and the rustls connector that matches its mode.
//! Every part of fairway that opens a database connection (the broker's pool and LISTEN
//! connection, the private server's set-up, the bench and chaos) goes through [`Database`].

mod conninfo;
mod tls;

use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};

pub use conninfo::SslMode;
pub use tls::Tls;

/// The stream of a connection, TLS or plain as the server and the mode agreed.
pub type Stream = <Tls as MakeTlsConnect<Socket>>::Stream;

/// Why a connection string cannot be used. Nothing has been connected when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionStringError {
    #[error("invalid connection string: {0}")]
    Syntax(String),
    #[error("{}", describe(.0))]
    Rejected(#[source] tokio_postgres::Error),
    #[error(
        "sslmode={0} is not one of disable, prefer, require, verify-ca or verify-full (`allow` \
         is not supported: use prefer)"
    )]
    UnknownSslMode(String),
    #[error("cannot read {setting} {}: {reason}", path.display())]
    File { setting: &'static str, path: PathBuf, reason: String },
    #[error("{setting} {} holds no {what}", path.display())]
    Empty { setting: &'static str, path: PathBuf, what: &'static str },
    #[error("sslcert and sslkey go together: {0} is set without the other")]
    HalfClientCertificate(&'static str),
    #[error(
        "sslmode={0} verifies the server's certificate and needs a CA to verify it against: set \
         sslrootcert to a PEM file, or to `system` for the system's trusted roots"
    )]
    NoRootCertificate(SslMode),
    #[error("the TLS settings cannot be used: {0}")]
    Tls(String),
}

/// A database to connect to: where, as whom, and how the connection is secured.
#[derive(Clone)]
pub struct Database {
    config: Config,
    tls: Tls,
}

impl Database {
    /// Reads a connection string, URL (`postgresql://…?sslmode=verify-full`) or key=value
    /// (`host=… sslmode=verify-full`), and loads the certificate files it names, so that a bad
    /// path is reported now rather than at the first connection.
    pub fn parse(text: &str) -> Result<Self, ConnectionStringError> {
        let (rest, settings) = conninfo::split_tls_settings(text)?;
        let mut config = Config::from_str(&rest).map_err(ConnectionStringError::Rejected)?;
        config.ssl_mode(settings.mode.unwrap_or_default().negotiation());
        let tls = Tls::from_settings(settings)?;
        Ok(Self { config, tls })
    }

    /// The tokio-postgres configuration: hosts, user, database and the TLS negotiation.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration to change, e.g. a session option; the TLS settings stay.
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// The same server and settings, database `dbname`.
    pub fn with_dbname(&self, dbname: &str) -> Self {
        let mut database = self.clone();
        database.config.dbname(dbname);
        database
    }

    /// The connector to hand to a pool.
    pub fn tls(&self) -> Tls {
        self.tls.clone()
    }

    /// Opens one connection; the caller drives the returned `Connection`.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, Stream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }
}

/// Where it connects and how, without the password: fit for a log line or an error.
impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = self.config.get_ports().iter().map(u16::to_string).collect();
        write!(f, "host={} port={}", hosts.join(","), ports.join(","))?;
        if let Some(dbname) = self.config.get_dbname() {
            write!(f, " dbname={dbname}")?;
        }
        if let Some(user) = self.config.get_user() {
            write!(f, " user={user}")?;
        }
        write!(f, " {}", self.tls)
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Database({self})")
    }
}

/// An error and every cause below it, each said once, with the server's severity and SQLSTATE
/// where PostgreSQL answered: tokio-postgres prints a refusal as just "db error", and a pool
/// wraps that again, so without the chain a log would not say why.
pub fn describe(error: &(dyn StdError + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = Some(error);
    while let Some(error) = next {
        let source = error.source();
        if let Some(db) = error.downcast_ref::<tokio_postgres::error::DbError>() {
            parts.push(format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            ));
            break;
        }
        let says_only_db_error = error
            .downcast_ref::<tokio_postgres::Error>()
            .is_some_and(|error| error.as_db_error().is_some());
        if !says_only_db_error {
            let mut text = error.to_string();
            // Some errors repeat their source in their own text; the source comes next.
            if let Some(inner) = source.map(|source| format!(": {source}")) {
                if text.ends_with(&inner) {
                    text.truncate(text.len() - inner.len());
                }
            }
            parts.push(text.replace('\n', "; "));
        }
        next = source;
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_url_keeps_its_meaning() {
        let database = Database::parse("postgresql://app@db.example:5433/fairway").unwrap();
        assert_eq!(database.config().get_dbname(), Some("fairway"));
        assert_eq!(database.config().get_ports(), &[5433]);
        assert_eq!(database.config().get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
        assert_eq!(
            database.to_string(),
            "host=db.example port=5433 dbname=fairway user=app sslmode=prefer"
        );
    }

    #[test]
    fn verify_modes_require_tls_and_a_root() {
        let error = Database::parse("host=db sslmode=verify-full").err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("needs a CA")));
        let database = Database::parse("host=db sslmode=verify-full sslrootcert=system").unwrap();
        assert_eq!(database.config().get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert!(database.to_string().ends_with("sslmode=verify-full sslrootcert=system"));
    }

    #[test]
    fn a_missing_certificate_file_is_named() {
        let error = Database::parse("postgres://db/x?sslmode=verify-ca&sslrootcert=/no/such.pem")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("sslrootcert /no/such.pem"), "{error}");
    }

    #[test]
    fn options_tokio_postgres_refuses_are_reported_as_such() {
        let error = Database::parse("host=db sslcrl=x").err().map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some("invalid connection string: unknown option `sslcrl`"));
    }

    #[test]
    fn describe_walks_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("inner\ndetail"));
        assert_eq!(describe(&error), "outer: inner; detail");
    }
}
