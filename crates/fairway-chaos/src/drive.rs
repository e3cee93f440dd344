//! `fairway chaos-drive`: the fault suite's worker process. Its workers claim and report over
//! HTTP as real ones do: a worker that cannot reach its broker moves to the next, a report
//! without an answer is sent again (to another broker), a few reports are sent twice as if the
//! first answer had been lost, and a few workers die holding their item. It records every
//! claim and every answer, and writes the record when its standard input says `stop` or ends.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{now_ms, ChaosError, Dice, SERVICES};
use crate::args::ChaosDriveArgs;
use fairway_api::model::WorkItem;
use fairway_client::{ClaimParams, Client, ClientError, Report};

/// How long a claim waits for work.
const CLAIM_WAIT: Duration = Duration::from_secs(2);
/// Pause before asking again after a broker could not answer.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a worker keeps sending a report that gets no answer; past it the lease has run out
/// anyway, and the item is someone else's.
const REPORT_PATIENCE: Duration = Duration::from_secs(60);
/// Workers per querier name (a pod's worker slots).
const SLOTS_PER_QUERIER: u32 = 8;
/// The simulated work per item, in milliseconds: a uniform draw below this.
const WORK_MS: u64 = 20;

/// A claim a worker received.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Claim {
    pub item: i64,
    pub attempt: i32,
    pub at_ms: u64,
}

/// A successful report the broker accepted; `repeat` when it was not the first sending.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Accepted {
    pub item: i64,
    pub attempt: i32,
    pub repeat: bool,
    pub at_ms: u64,
}

/// A request that got no answer (`status` 0) or an error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub op: String,
    pub status: u16,
    pub repeat: bool,
    /// When the answer came.
    pub at_ms: u64,
    /// When the request was sent: a request in flight through a fault may be refused after it.
    pub sent_ms: u64,
    pub message: String,
}

/// Everything the worker process saw.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Record {
    pub claims: Vec<Claim>,
    pub accepted: Vec<Accepted>,
    pub refused: Vec<Refusal>,
    /// Items whose worker died holding them.
    pub abandoned: u64,
    /// Reports sent again, after no answer or a deliberately lost one.
    pub repeats: u64,
    /// Items their worker handed back unworked, as the broker accepted.
    pub released: u64,
}

impl Refusal {
    pub fn of(op: &str, error: &ClientError, repeat: bool, sent_ms: u64) -> Self {
        let status = match error {
            ClientError::Api { status, .. } | ClientError::Unexpected { status, .. } => {
                status.as_u16()
            }
            ClientError::Transport(_) | ClientError::CaCert { .. } | ClientError::Url(_) => 0,
        };
        let (at_ms, message) = (now_ms(), error.to_string());
        Self { op: op.to_owned(), status, repeat, at_ms, sent_ms, message }
    }
}

struct Shared {
    clients: Vec<Client>,
    record: Mutex<Record>,
    /// Once set, no worker dies any more.
    calm: AtomicBool,
    stop: CancellationToken,
    abandoned: AtomicU64,
    repeats: AtomicU64,
    die_per_mille: u64,
    repeat_per_mille: u64,
    release_per_mille: u64,
    released: AtomicU64,
}

impl Shared {
    fn note(&self, write: impl FnOnce(&mut Record)) {
        // A poisoned record means a worker panicked: a bug the missing entries will show.
        if let Ok(mut record) = self.record.lock() {
            write(&mut record);
        }
    }
}

pub async fn run(args: ChaosDriveArgs) -> Result<(), ChaosError> {
    // Each worker is given two brokers: the one it starts with, and the next.
    let clients = (0..args.url.len())
        .map(|first| Client::new(&crate::starting_at(&args.url, first, 2).join(","), None))
        .collect::<Result<Vec<_>, _>>()?;
    let shared = Arc::new(Shared {
        clients,
        record: Mutex::new(Record::default()),
        calm: AtomicBool::new(args.die_per_mille == 0),
        stop: CancellationToken::new(),
        abandoned: AtomicU64::new(0),
        repeats: AtomicU64::new(0),
        die_per_mille: args.die_per_mille,
        repeat_per_mille: args.repeat_per_mille,
        release_per_mille: args.release_per_mille,
        released: AtomicU64::new(0),
    });
    let orders = shared.clone();
    // Standard input is read on a thread of its own: tokio's reader needs a feature we lack.
    std::thread::spawn(move || follow_orders(orders));
    let workers: Vec<_> =
        (0..args.workers).map(|slot| tokio::spawn(work(shared.clone(), slot))).collect();
    for worker in workers {
        if let Err(error) = worker.await {
            eprintln!("a chaos worker stopped unexpectedly: {error}");
        }
    }
    let mut record = shared
        .record
        .lock()
        .map(|mut record| std::mem::take(&mut *record))
        .map_err(|_| ChaosError::Setup("a worker panicked while recording".to_owned()))?;
    record.abandoned = shared.abandoned.load(Ordering::Relaxed);
    record.released = shared.released.load(Ordering::Relaxed);
    record.repeats = shared.repeats.load(Ordering::Relaxed);
    std::fs::write(&args.record, serde_json::to_vec(&record)?)?;
    Ok(())
}

/// Reads the suite's orders on standard input: `calm` (no more deaths), then `stop` or the end.
fn follow_orders(shared: Arc<Shared>) {
    for line in std::io::stdin().lines() {
        match line.as_deref().map(str::trim) {
            Ok("calm") => shared.calm.store(true, Ordering::Relaxed),
            Ok("stop") | Err(_) => break,
            Ok(_) => {}
        }
    }
    shared.stop.cancel();
}

/// One worker: claims an item of its service, works it, reports it, until told to stop.
async fn work(shared: Arc<Shared>, slot: u32) {
    let brokers = shared.clients.len();
    let mut broker = slot as usize % brokers;
    let mut dice = Dice::new(u64::from(slot));
    let querier = format!("chaos-pod-{}", slot / SLOTS_PER_QUERIER);
    let params = ClaimParams {
        service: SERVICES[slot as usize % SERVICES.len()],
        querier: &querier,
        worker: slot % 1024,
        max: 1,
        wait: CLAIM_WAIT,
    };
    while !shared.stop.is_cancelled() {
        let sent = now_ms();
        let claimed = tokio::select! {
            _ = shared.stop.cancelled() => break,
            claimed = shared.clients[broker].claim(&params) => claimed,
        };
        let items = match claimed {
            Ok(items) => items,
            Err(error) => {
                shared
                    .note(|record| record.refused.push(Refusal::of("claim", &error, false, sent)));
                broker = (broker + 1) % brokers;
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        for item in items {
            let (id, attempt) = (item.id.0, item.attempt);
            shared.note(|record| record.claims.push(Claim { item: id, attempt, at_ms: now_ms() }));
            if !shared.calm.load(Ordering::Relaxed) && dice.per_mille(shared.die_per_mille) {
                // This worker dies: the item stays leased until its lease runs out.
                shared.abandoned.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if !shared.calm.load(Ordering::Relaxed) && dice.per_mille(shared.release_per_mille) {
                // This worker cannot start the item: it hands it back, once; an unanswered
                // release leaves the item to its lease, as a dying worker does.
                let release = Report::Released { attempt, reason: Some("chaos".to_owned()) };
                let sent = now_ms();
                match shared.clients[broker].report(id, &release).await {
                    Ok(_) => {
                        shared.released.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => shared.note(|record| {
                        record.refused.push(Refusal::of("release", &error, false, sent))
                    }),
                }
                continue;
            }
            tokio::time::sleep(Duration::from_millis(dice.below(WORK_MS))).await;
            broker = report(&shared, broker, &item, &mut dice).await;
        }
    }
}

/// Reports `item` successful until a broker answers, moving to the next broker after each
/// failure; returns the broker that answered.
async fn report(shared: &Shared, mut broker: usize, item: &WorkItem, dice: &mut Dice) -> usize {
    let (id, attempt) = (item.id.0, item.attempt);
    let report =
        Report::Successful { attempt, results: vec![json!(format!("r{id}"))], component: None };
    let mut lose_answer = dice.per_mille(shared.repeat_per_mille);
    let mut repeat = false;
    let patience = Instant::now() + REPORT_PATIENCE;
    loop {
        let sent = now_ms();
        match shared.clients[broker].report(id, &report).await {
            Ok(_) if lose_answer => lose_answer = false,
            Ok(_) => {
                let accepted = Accepted { item: id, attempt, repeat, at_ms: now_ms() };
                shared.note(|record| record.accepted.push(accepted));
                return broker;
            }
            Err(error) => {
                shared.note(|record| {
                    record.refused.push(Refusal::of("report", &error, repeat, sent))
                });
                if !error.is_transient() || Instant::now() > patience {
                    return broker;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        repeat = true;
        shared.repeats.fetch_add(1, Ordering::Relaxed);
        broker = (broker + 1) % shared.clients.len();
    }
}
