//! Group commit in the broker. Requests of one kind (claims, or attempt endings) that arrive
//! while earlier ones are being written queue up, and the next free lane takes all of them into
//! one transaction. Under load that pays a commit, a round trip and a statement start per batch
//! instead of per item; when requests are sparse each goes alone, without waiting for company.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{oneshot, Semaphore};

use crate::error::BrokerError;

/// Which request of a batch of `len` a row of the batch's statement answers, from the 1-based
/// index the row gives. A row that names no request of the batch means the batch is lost.
pub fn batch_index(one_based: i32, len: usize) -> Result<usize, BrokerError> {
    usize::try_from(one_based - 1).ok().filter(|index| *index < len).ok_or(BrokerError::BatchLost)
}

/// A queue of requests `R`, each answered with a `T`, worked off by a bounded number of lanes.
pub struct Batches<R, T> {
    inner: Arc<Inner<R, T>>,
}

impl<R, T> Clone for Batches<R, T> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

struct Inner<R, T> {
    queue: Mutex<VecDeque<Queued<R, T>>>,
    /// One permit per lane that may run a batch at the same time.
    lanes: Arc<Semaphore>,
    /// Permits this queue's lanes share with other queues' (see [`KeyedBatches`]): a lane
    /// holds one while it runs batches.
    shared: Option<Arc<Semaphore>>,
    most: usize,
}

struct Queued<R, T> {
    request: R,
    answer: oneshot::Sender<T>,
}

impl<R: Send + 'static, T: Send + 'static> Batches<R, T> {
    /// At most `lanes` batches run at once, each of at most `most` requests.
    pub fn new(lanes: usize, most: usize) -> Self {
        Self::with_shared(lanes, most, None)
    }

    fn with_shared(lanes: usize, most: usize, shared: Option<Arc<Semaphore>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                queue: Mutex::new(VecDeque::new()),
                lanes: Arc::new(Semaphore::new(lanes.max(1))),
                shared,
                most: most.max(1),
            }),
        }
    }

    /// Queues `request` and waits for its answer. `run` answers one batch, one answer per
    /// request and in their order; every caller passes an equivalent `run`, since whichever
    /// lane is free runs the batch. None if the batch was lost (`run` panicked).
    ///
    /// The batch runs in a task of its own: a caller that goes away does not abort the
    /// transaction of the others in its batch. Its request is dropped if no batch took it yet;
    /// if a batch took it, its answer, which no one will read, goes to `unanswered` (together
    /// with the batch's other such answers) once the batch is done.
    pub async fn submit<F, Fut, U, UFut>(&self, request: R, run: F, unanswered: U) -> Option<T>
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<T>> + Send,
        U: Fn(Vec<T>) -> UFut + Send + Sync + 'static,
        UFut: Future<Output = ()> + Send,
    {
        let (answer, receiver) = oneshot::channel();
        self.inner.lock().push_back(Queued { request, answer });
        self.inner.start_lane(Arc::new((run, unanswered)));
        receiver.await.ok()
    }
}

impl<R: Send + 'static, T: Send + 'static> Inner<R, T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued<R, T>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a lane unless every lane is busy: a busy lane takes the queue when it is done.
    fn start_lane<F, Fut, U, UFut>(self: &Arc<Self>, handlers: Arc<(F, U)>)
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<T>> + Send,
        U: Fn(Vec<T>) -> UFut + Send + Sync + 'static,
        UFut: Future<Output = ()> + Send,
    {
        let Ok(permit) = self.lanes.clone().try_acquire_owned() else {
            return;
        };
        let inner = self.clone();
        tokio::spawn(async move {
            // The semaphore is never closed, so this waits for a permit and gets one.
            let shared = match &inner.shared {
                Some(shared) => shared.clone().acquire_owned().await.ok(),
                None => None,
            };
            loop {
                let batch = inner.take_batch();
                if batch.is_empty() {
                    break;
                }
                let (requests, answers): (Vec<R>, Vec<oneshot::Sender<T>>) =
                    batch.into_iter().map(|queued| (queued.request, queued.answer)).unzip();
                let (run, unanswered) = &*handlers;
                let mut unread = Vec::new();
                for (answer, result) in answers.into_iter().zip(run(requests).await) {
                    // The caller may have gone away meanwhile: its answer is handed back.
                    if let Err(result) = answer.send(result) {
                        unread.push(result);
                    }
                }
                if !unread.is_empty() {
                    unanswered(unread).await;
                }
            }
            drop(shared);
            drop(permit);
            // A request queued after the queue was found empty, but before the permit went
            // back, found every lane busy: it must not wait for the next caller.
            if !inner.lock().is_empty() {
                inner.start_lane(handlers);
            }
        });
    }

    /// The next batch: up to `most` queued requests whose callers still wait.
    fn take_batch(&self) -> Vec<Queued<R, T>> {
        let mut queue = self.lock();
        let mut batch = Vec::with_capacity(queue.len().min(self.most));
        while batch.len() < self.most {
            match queue.pop_front() {
                Some(queued) if queued.answer.is_closed() => continue,
                Some(queued) => batch.push(queued),
                None => break,
            }
        }
        batch
    }
}

/// Queues of requests by key (a claim's service): requests of one key share batches, and
/// each key's batches run one at a time, while those of different keys run side by side, up
/// to a number of lanes in all.
pub struct KeyedBatches<R, T> {
    queues: Mutex<HashMap<String, Batches<R, T>>>,
    /// The queue of the keys that come after [`MOST_KEYS`] others.
    overflow: Batches<R, T>,
    lanes: Arc<Semaphore>,
    most: usize,
}

/// Keys with a queue of their own. Keys come from requests (a claim may name any service), so
/// the map is bounded; the keys past it share one queue.
const MOST_KEYS: usize = 1024;

impl<R: Send + 'static, T: Send + 'static> KeyedBatches<R, T> {
    /// At most `lanes` batches run at once over all keys, each of at most `most` requests.
    pub fn new(lanes: usize, most: usize) -> Self {
        let lanes = Arc::new(Semaphore::new(lanes.max(1)));
        Self {
            queues: Mutex::new(HashMap::new()),
            overflow: Batches::with_shared(1, most, Some(lanes.clone())),
            lanes,
            most,
        }
    }

    /// The queue of `key`'s requests.
    pub fn queue(&self, key: &str) -> Batches<R, T> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = queues.get(key) {
            return queue.clone();
        }
        if queues.len() >= MOST_KEYS {
            return self.overflow.clone();
        }
        let queue = Batches::with_shared(1, self.most, Some(self.lanes.clone()));
        queues.insert(key.to_owned(), queue.clone());
        queue
    }
}

/// Queues `request` in `batches` and waits for its answer; whichever lane is free serves the
/// batch with `run`, given a clone of `owner`, and hands the answers whose callers left
/// meanwhile to `unanswered`.
pub async fn in_batch<S, R, T, Fut, UFut>(
    owner: &S,
    batches: &Batches<R, Result<T, BrokerError>>,
    request: R,
    run: fn(S, Vec<R>) -> Fut,
    unanswered: fn(S, Vec<Result<T, BrokerError>>) -> UFut,
) -> Result<T, BrokerError>
where
    S: Clone + Send + Sync + 'static,
    R: Send + 'static,
    T: Send + 'static,
    Fut: Future<Output = Vec<Result<T, BrokerError>>> + Send + 'static,
    UFut: Future<Output = ()> + Send + 'static,
{
    let owner_for_run = owner.clone();
    let run = move |batch: Vec<R>| run(owner_for_run.clone(), batch);
    let owner = owner.clone();
    let unanswered = move |answers| unanswered(owner.clone(), answers);
    batches.submit(request, run, unanswered).await.unwrap_or(Err(BrokerError::BatchLost))
}

/// Answers every request of a batch by `run` on the whole batch, one transaction. Should that
/// transaction fail, `run` goes over each request alone, so that each gets its own answer or
/// error rather than a neighbour's.
pub async fn answer_each<'a, R, T, F, Fut>(requests: &'a [R], run: F) -> Vec<Result<T, BrokerError>>
where
    F: Fn(&'a [R]) -> Fut,
    Fut: Future<Output = Result<Vec<Result<T, BrokerError>>, BrokerError>> + 'a,
{
    match run(requests).await {
        Ok(answers) => answers,
        Err(error) if requests.len() == 1 => vec![Err(error)],
        // Retried already, as a whole: no request of the batch is to blame more than another,
        // and going one by one would only meet the same contention again.
        Err(error) if error.copy_contended().is_some() => requests
            .iter()
            .map(|_| Err(error.copy_contended().unwrap_or(BrokerError::BatchLost)))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, requests = requests.len(), "batch failed; one by one");
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(match run(std::slice::from_ref(request)).await {
                    Ok(mut answer) => answer.pop().unwrap_or(Err(BrokerError::BatchLost)),
                    Err(error) => Err(error),
                });
            }
            answers
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::future::join_all;

    use super::*;

    /// On one thread, all 64 requests are queued before the lane's task first runs.
    #[tokio::test(flavor = "current_thread")]
    async fn queued_requests_share_batches_and_each_gets_its_own_answer() {
        let batches: Batches<u32, u32> = Batches::new(1, 8);
        let runs = Arc::new(AtomicUsize::new(0));
        let calls = (0..64).map(|request| {
            let runs = runs.clone();
            batches.submit(
                request,
                move |batch: Vec<u32>| {
                    let runs = runs.clone();
                    async move {
                        assert_eq!(batch.len(), 8);
                        runs.fetch_add(1, Ordering::SeqCst);
                        batch.into_iter().map(|request| request * 10).collect::<Vec<_>>()
                    }
                },
                nobody,
            )
        });
        let answers = join_all(calls).await;
        let expected: Vec<_> = (0..64).map(|request| Some(request * 10)).collect();
        assert_eq!(answers, expected);
        assert_eq!(runs.load(Ordering::SeqCst), 8);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_whose_caller_left_is_not_run() {
        let batches: Batches<u32, u32> = Batches::new(1, 8);
        let ran = Arc::new(Mutex::new(Vec::new()));
        let run = |ran: Arc<Mutex<Vec<u32>>>| {
            move |batch: Vec<u32>| {
                let ran = ran.clone();
                async move {
                    ran.lock().unwrap_or_else(PoisonError::into_inner).extend(&batch);
                    batch
                }
            }
        };
        // Polled once, so queued, then dropped before the lane's task could run.
        let mut abandoned = Box::pin(batches.submit(1, run(ran.clone()), nobody));
        assert!(futures_util::poll!(abandoned.as_mut()).is_pending());
        drop(abandoned);
        assert_eq!(batches.submit(2, run(ran.clone()), nobody).await, Some(2));
        assert_eq!(*ran.lock().unwrap_or_else(PoisonError::into_inner), vec![2]);
    }

    /// A caller that leaves while its batch runs: its answer, which no one reads, is handed to
    /// `unanswered`, and the others of the batch get theirs.
    #[tokio::test(flavor = "current_thread")]
    async fn the_answer_of_a_caller_that_left_mid_batch_is_handed_back() {
        let batches: Batches<u32, u32> = Batches::new(1, 8);
        let (go, gate) = tokio::sync::watch::channel(false);
        let handed_back = Arc::new(Mutex::new(Vec::new()));
        let call = |request: u32| {
            let gate = gate.clone();
            let handed_back = handed_back.clone();
            batches.submit(
                request,
                move |batch: Vec<u32>| {
                    let mut gate = gate.clone();
                    async move {
                        let _ = gate.wait_for(|open| *open).await;
                        batch
                    }
                },
                move |unread: Vec<u32>| {
                    let handed_back = handed_back.clone();
                    async move {
                        handed_back.lock().unwrap_or_else(PoisonError::into_inner).extend(unread);
                    }
                },
            )
        };
        let mut leaving = Box::pin(call(1));
        let mut staying = Box::pin(call(2));
        assert!(futures_util::poll!(leaving.as_mut()).is_pending());
        assert!(futures_util::poll!(staying.as_mut()).is_pending());
        // Let the lane take both into its batch, then the first caller goes.
        tokio::task::yield_now().await;
        drop(leaving);
        go.send_replace(true);
        assert_eq!(staying.await, Some(2));
        tokio::task::yield_now().await;
        assert_eq!(*handed_back.lock().unwrap_or_else(PoisonError::into_inner), vec![1]);
    }

    async fn nobody(_: Vec<u32>) {}

    /// Counts the batches running at once, per key and in all, while each takes a while.
    #[derive(Default)]
    struct Overlap {
        running: Mutex<HashMap<&'static str, usize>>,
        most_per_key: AtomicUsize,
        most_in_all: AtomicUsize,
    }

    impl Overlap {
        async fn run(&self, key: &'static str) {
            {
                let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
                *running.entry(key).or_default() += 1;
                self.most_per_key.fetch_max(running[key], Ordering::SeqCst);
                self.most_in_all.fetch_max(running.values().sum(), Ordering::SeqCst);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            *running.entry(key).or_default() -= 1;
        }
    }

    /// Sends four requests of each key, one batch each, and returns the most batches that ran
    /// at once for one key and in all.
    async fn overlap(lanes: usize) -> (usize, usize) {
        let keyed: KeyedBatches<u32, u32> = KeyedBatches::new(lanes, 1);
        let overlap = Arc::new(Overlap::default());
        let calls = ["a", "b"].into_iter().flat_map(|key| {
            let queue = keyed.queue(key);
            let overlap = overlap.clone();
            (0..4).map(move |request| {
                let overlap = overlap.clone();
                let run = move |batch: Vec<u32>| {
                    let overlap = overlap.clone();
                    async move {
                        overlap.run(key).await;
                        batch
                    }
                };
                let queue = queue.clone();
                async move { queue.submit(request, run, nobody).await }
            })
        });
        let answers = join_all(calls).await;
        assert!(answers.iter().all(Option::is_some), "every request answered");
        let most_per_key = overlap.most_per_key.load(Ordering::SeqCst);
        (most_per_key, overlap.most_in_all.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn keys_run_side_by_side_and_each_key_one_batch_at_a_time() {
        assert_eq!(overlap(2).await, (1, 2));
    }

    #[tokio::test]
    async fn keys_take_turns_when_there_is_one_lane_for_all() {
        assert_eq!(overlap(1).await, (1, 1));
    }

    /// A batch that fails as a whole is retried one request at a time: the request that broke
    /// it gets its error, the others their answers.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_batch_is_answered_one_by_one() {
        let runs = AtomicUsize::new(0);
        let run = |batch: &[u32]| {
            runs.fetch_add(1, Ordering::SeqCst);
            let poisoned = batch.contains(&3);
            let answers: Vec<Result<u32, BrokerError>> = batch.iter().map(|n| Ok(n * 10)).collect();
            async move {
                if poisoned {
                    Err(BrokerError::invalid("poisoned", "3 breaks any batch it is in"))
                } else {
                    Ok(answers)
                }
            }
        };
        let answers = answer_each(&[1, 2, 3, 4], run).await;
        let answers: Vec<Result<u32, String>> =
            answers.into_iter().map(|answer| answer.map_err(|error| error.to_string())).collect();
        assert_eq!(
            answers,
            vec![Ok(10), Ok(20), Err("3 breaks any batch it is in".to_owned()), Ok(40)]
        );
        assert_eq!(runs.load(Ordering::SeqCst), 5, "the batch, then each of its four requests");
    }
}
