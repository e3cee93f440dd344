//! When workers last asked for each service's work. Kept in memory on every work request and
//! written to the database every few seconds, so that an operator can tell a service with no
//! worker from one whose workers are busy, across brokers, without a write per long poll.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use super::statements::{ListServiceAsks, RecordServiceAsks};
use super::Claims;
use crate::db::sql;
use crate::error::BrokerError;

/// Most services remembered: the names come from requests, so memory stays bounded whatever a
/// client sends. A service past it still gets its work; only its asks go unrecorded.
const MOST_SERVICES: usize = 10_000;

#[derive(Default)]
pub struct ServiceAsks {
    inner: Mutex<Asks>,
}

#[derive(Default)]
struct Asks {
    latest: BTreeMap<String, DateTime<Utc>>,
    /// Services asked for since the last flush.
    unwritten: BTreeSet<String>,
}

impl ServiceAsks {
    /// A worker asked for `service`'s work now.
    pub fn record(&self, service: &str) {
        let mut asks = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if asks.latest.len() >= MOST_SERVICES && !asks.latest.contains_key(service) {
            return;
        }
        asks.latest.insert(service.to_owned(), Utc::now());
        if !asks.unwritten.contains(service) {
            asks.unwritten.insert(service.to_owned());
        }
    }

    /// The asks not yet written, taken: each service once, with its latest time.
    pub fn take_unwritten(&self) -> Vec<(String, DateTime<Utc>)> {
        let mut asks = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let unwritten = std::mem::take(&mut asks.unwritten);
        unwritten
            .into_iter()
            .filter_map(|service| asks.latest.get(&service).map(|at| (service, *at)))
            .collect()
    }

    /// Puts back asks whose write failed, unless a later ask came meanwhile.
    pub fn restore(&self, failed: Vec<(String, DateTime<Utc>)>) {
        let mut asks = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        asks.unwritten.extend(failed.into_iter().map(|(service, _)| service));
    }

    /// This broker's latest ask per service.
    pub fn latest(&self) -> BTreeMap<String, DateTime<Utc>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).latest.clone()
    }
}

impl Claims {
    /// Writes the asks for work this broker saw since the last flush, each service's latest.
    /// One statement for all of them; a failed write is tried again at the next flush.
    pub async fn flush_asks(&self) -> Result<(), BrokerError> {
        let asks = self.asks.take_unwritten();
        if asks.is_empty() {
            return Ok(());
        }
        let services: Vec<&str> = asks.iter().map(|(service, _)| service.as_str()).collect();
        let asked_at: Vec<_> = asks.iter().map(|(_, at)| *at).collect();
        let record = RecordServiceAsks { services: &services, asked_at: &asked_at };
        let written = match self.core.client().await {
            Ok(client) => sql::run(&client, &record).await.map(|_| ()).map_err(BrokerError::from),
            Err(error) => Err(error),
        };
        if written.is_err() {
            self.asks.restore(asks);
        }
        written
    }

    /// This broker's latest ask per service.
    pub fn latest_asks(&self) -> BTreeMap<String, DateTime<Utc>> {
        self.asks.latest()
    }
}

/// When workers last asked for each service, on any broker, as the last flushes wrote it.
pub(crate) async fn last_asked_everywhere(
    client: &impl GenericClient,
) -> Result<BTreeMap<String, DateTime<Utc>>, BrokerError> {
    let asks = sql::fetch_all(client, &ListServiceAsks {}).await?;
    Ok(asks.into_iter().map(|row| (row.service, row.last_asked)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_is_written_once_per_flush_with_its_latest_ask() {
        let asks = ServiceAsks::default();
        asks.record("render");
        asks.record("subset");
        asks.record("render");
        let first = asks.take_unwritten();
        assert_eq!(first.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(), ["render", "subset"]);
        assert_eq!(first[0].1, asks.latest()["render"]);
        assert!(asks.take_unwritten().is_empty(), "nothing new since");
        asks.restore(first);
        assert_eq!(asks.take_unwritten().len(), 2, "a failed write is tried again");
    }
}
