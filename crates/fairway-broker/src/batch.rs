//! Group commit in the broker. Requests of one kind (claims, or attempt endings) that arrive
//! while earlier ones are being written queue up, and the next free lane takes all of them into
//! one transaction. Under load that pays a commit, a round trip and a statement start per batch
//! instead of per item; when requests are sparse each goes alone, without waiting for company.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{oneshot, Semaphore};

use super::BrokerError;

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
    most: usize,
}

struct Queued<R, T> {
    request: R,
    answer: oneshot::Sender<T>,
}

impl<R: Send + 'static, T: Send + 'static> Batches<R, T> {
    /// At most `lanes` batches run at once, each of at most `most` requests.
    pub fn new(lanes: usize, most: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                queue: Mutex::new(VecDeque::new()),
                lanes: Arc::new(Semaphore::new(lanes.max(1))),
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
