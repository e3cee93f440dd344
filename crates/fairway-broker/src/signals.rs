//! Wake-ups between the requests one broker holds: workers waiting for a service's work, and
//! producers waiting for a job to finish, woken by this broker's changes and by the database's
//! notifications of every other broker's.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use fairway_api::model::JobId;

/// Wakes workers that long-poll for a service when work for it becomes ready, and producers
/// that wait for a job when it finishes. Fed by the database's notifications, so every broker
/// process hears about work any of them created and jobs any of them finished.
#[derive(Clone, Default)]
pub struct WorkSignals {
    services: Arc<Mutex<HashMap<String, Arc<ServiceSignal>>>>,
    jobs: Arc<Mutex<HashMap<JobId, JobSignal>>>,
}

/// The waiters for one job, and how many hold a watch on it: the entry goes with the last.
struct JobSignal {
    finished: Arc<Notify>,
    watches: usize,
}

/// A producer's interest in one job's end, held while it waits.
pub struct JobWatch {
    jobs: Arc<Mutex<HashMap<JobId, JobSignal>>>,
    job_id: JobId,
    finished: Arc<Notify>,
}

impl JobWatch {
    /// Completes when the job may have finished. Register it (`Notified::enable`) before
    /// reading the job, so that a finish in between is not missed.
    pub fn finished(&self) -> tokio::sync::futures::Notified<'_> {
        self.finished.notified()
    }
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = jobs.get_mut(&self.job_id) {
            signal.watches -= 1;
            if signal.watches == 0 {
                jobs.remove(&self.job_id);
            }
        }
    }
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
        self.wake_polls();
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in jobs.values() {
            signal.finished.notify_waiters();
        }
    }

    /// Watches for the end of job `job_id` until the watch is dropped.
    pub fn watch_job(&self, job_id: JobId) -> JobWatch {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let signal = jobs
            .entry(job_id)
            .or_insert_with(|| JobSignal { finished: Arc::default(), watches: 0 });
        signal.watches += 1;
        JobWatch { jobs: self.jobs.clone(), job_id, finished: signal.finished.clone() }
    }

    /// How many producers this broker holds waiting for a job right now.
    pub fn job_waiters(&self) -> usize {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.values().map(|signal| signal.watches).sum()
    }

    /// Wakes whoever waits for the job whose id is `job_id` (as a notification carries it).
    /// Wakes every long poll waiting for work, whatever its service.
    pub fn wake_polls(&self) {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in services.values() {
            signal.ready.notify_waiters();
        }
    }

    pub fn job_finished(&self, job_id: &str) {
        let Ok(job_id) = job_id.parse().map(JobId) else {
            tracing::warn!(job_id, "a job-finished notification names no job id");
            return;
        };
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = jobs.get(&job_id) {
            signal.finished.notify_waiters();
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
