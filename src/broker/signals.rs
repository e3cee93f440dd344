use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Wakes workers that long-poll for a service when work for it becomes ready. Fed by the
/// database's notifications, so every broker process hears about work any of them created.
#[derive(Clone, Default)]
pub struct WorkSignals {
    services: Arc<Mutex<HashMap<String, Arc<ServiceSignal>>>>,
}

#[derive(Default)]
pub struct ServiceSignal {
    ready: Notify,
    released: Notify,
    waiting: AtomicUsize,
}

impl ServiceSignal {
    /// Completes when this broker released a user of the service (a claim or completion
    /// committed), so that a claim that found every user busy can look again.
    pub fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }

    /// One user of the service is free again: one waiting claim may try.
    pub fn release_one(&self) {
        self.released.notify_one();
    }

    /// Register interest (`Notified::enable`) before looking for work, so that work arriving in
    /// between is not missed.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.ready.notified()
    }

    /// Counts the caller as an idle worker of the service until the guard is dropped.
    pub fn waiting(&self) -> WaitingGuard<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        WaitingGuard(&self.waiting)
    }
}

pub struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WorkSignals {
    pub fn for_service(&self, service: &str) -> Arc<ServiceSignal> {
        let mut services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services.entry(service.to_owned()).or_default().clone()
    }

    pub fn work_ready(&self, service: &str) {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = services.get(service) {
            signal.ready.notify_waiters();
        }
    }

    /// Wakes every waiter: used when notifications may have been missed (a lost connection).
    pub fn wake_all(&self) {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in services.values() {
            signal.ready.notify_waiters();
        }
    }

    /// How many workers of each service this broker holds in a long poll right now.
    pub fn waiting_workers(&self) -> BTreeMap<String, usize> {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services
            .iter()
            .map(|(service, signal)| (service.clone(), signal.waiting.load(Ordering::Relaxed)))
            .collect()
    }
}
