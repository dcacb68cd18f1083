//! [`Reporter`]: tell the lock service about every stale write a fence
//! refuses, without slowing the fence down.
//!
//! A refused write is the one place where "a paused holder tried to write
//! late" can be seen: the fence knows the lock, the refused token and its own
//! highest, and nobody else does. Reported to the lock service
//! (`fencelock::Client::report_refusal`, the `ReportRefusal` RPC), each
//! refusal becomes a `write_refused` event of the lock in every member's
//! watch, a count in its metrics and a line of its audit log.
//!
//! ```no_run
//! # use fencelock_fence::{Fence, Fenced, MemoryFence, report::Reporter};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # #[cfg(feature = "client")] {
//! let client = fencelock::Client::builder("fencelock://127.0.0.1:7070").token("flt_…".to_string()).connect().await?;
//! let reporter = Reporter::new(client); // a background task sends the reports
//! let fence = MemoryFence::new();
//! if let Fenced::Stale(stale) = fence.admit("orders-42", 5).await? {
//!     reporter.report("orders", &stale, "orders-42"); // never waits
//!     // … refuse the write
//! }
//! # }
//! # Ok(()) }
//! ```
//!
//! # Never in the way of the write path
//!
//! [`Reporter::report`] only puts the report in a bounded queue
//! ([`DEFAULT_QUEUE`] by default) and returns; a task of its own sends the
//! queued reports one after the other. When the queue is full (the lock
//! service is slow, down, or refusing reports beyond its rate) a report is
//! dropped and counted ([`Reporter::dropped`]); a report the service refused
//! or could not take is logged at debug and counted ([`Reporter::failed`]).
//! Neither ever reaches the caller: a fence's answer must not depend on the
//! lock service. A report is sent once, never retried beyond what the client
//! itself does for a call.
//!
//! The identity that reports needs the `check` verb on the lock (the
//! lock service's verb for resource servers). The service refuses reports
//! beyond its rate (50 a second per node, bursts of 100): those count as
//! failed here.
//!
//! Where it sits: beside the fences, built on [`crate::Stale`]; the
//! [`RefusalSink`] it sends to is the fencelock client (feature `client`) or
//! anything else that implements it. The fenced storage server
//! ([`crate::storage`]) reports its refused writes through one
//! ([`crate::storage::Config::reporter`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::fence::{BoxError, Stale};

/// How many reports wait to be sent, at most, unless set otherwise
/// ([`Reporter::with_queue`]).
pub const DEFAULT_QUEUE: usize = 1024;

/// The longest resource a report carries, in bytes: the lock service's limit.
pub const MAX_RESOURCE_BYTES: usize = 256;

/// One refused operation, as it is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The lock whose token the refused operation carried.
    pub lock: String,
    /// The token refused.
    pub refused: u64,
    /// The fence's mark that refused it (above `refused`).
    pub highest: u64,
    /// What the fence protects (a key), at most [`MAX_RESOURCE_BYTES`] of
    /// UTF-8 without control characters; "" for none.
    pub resource: String,
}

impl Refusal {
    /// The report of `stale`, refused on `resource` under `lock`. The
    /// resource is cut to [`MAX_RESOURCE_BYTES`] (at a character boundary)
    /// and its control characters replaced by `�`, as the lock service takes
    /// it: a fence's key may be longer (up to [`crate::MAX_KEY_LEN`]).
    pub fn of(lock: &str, stale: &Stale, resource: &str) -> Refusal {
        let mut shown = String::with_capacity(resource.len().min(MAX_RESOURCE_BYTES));
        for c in resource.chars().map(|c| if c.is_control() { char::REPLACEMENT_CHARACTER } else { c }) {
            if shown.len() + c.len_utf8() > MAX_RESOURCE_BYTES {
                break;
            }
            shown.push(c);
        }
        Refusal { lock: lock.to_owned(), refused: stale.got, highest: stale.highest, resource: shown }
    }
}

/// Where reports go: the lock service. The fencelock client implements it
/// (feature `client`); tests implement it with a list.
#[async_trait]
pub trait RefusalSink: Send + Sync + 'static {
    /// Send one report; an error is the report's failure (logged and counted
    /// by the [`Reporter`], never retried by it).
    async fn report_refusal(&self, refusal: &Refusal) -> Result<(), BoxError>;
}

#[async_trait]
impl<S: RefusalSink + ?Sized> RefusalSink for Arc<S> {
    async fn report_refusal(&self, refusal: &Refusal) -> Result<(), BoxError> {
        (**self).report_refusal(refusal).await
    }
}

/// The fencelock client's `ReportRefusal` call (needs `check` on the lock).
#[cfg(feature = "client")]
#[async_trait]
impl RefusalSink for fencelock::Client {
    async fn report_refusal(&self, r: &Refusal) -> Result<(), BoxError> {
        Ok(fencelock::Client::report_refusal(self, &r.lock, r.refused, r.highest, &r.resource).await?)
    }
}

/// The fencelock lock service at a URL (`fencelock::Client::connect`'s
/// grammar: `fencelock://host:7070`, a group `fencelock://a,b,c`, TLS with
/// `fencelock+tls://…?ca=…`, a bearer token with `token=`), connected at its
/// first report rather than at once, and again after a connect that failed:
/// a fence starts and serves whether or not the lock service can be reached
/// (`fencelock storage --report-to`). The URL may hold a token: it is never
/// shown.
#[cfg(feature = "client")]
pub struct LockService {
    url: String,
    client: tokio::sync::OnceCell<fencelock::Client>,
}

#[cfg(feature = "client")]
impl LockService {
    /// The lock service at `url`, not connected yet.
    pub fn new(url: impl Into<String>) -> LockService {
        LockService { url: url.into(), client: tokio::sync::OnceCell::new() }
    }
}

#[cfg(feature = "client")]
impl std::fmt::Debug for LockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockService").field("connected", &self.client.initialized()).finish_non_exhaustive()
    }
}

#[cfg(feature = "client")]
#[async_trait]
impl RefusalSink for LockService {
    async fn report_refusal(&self, r: &Refusal) -> Result<(), BoxError> {
        let client = self.client.get_or_try_init(|| fencelock::Client::connect(self.url.clone())).await?;
        RefusalSink::report_refusal(client, r).await
    }
}

/// What became of the reports given to a [`Reporter`].
#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

/// Reports refusals to a [`RefusalSink`] from a task of its own, through a
/// bounded queue (see the module docs). Clones share the queue, the task and
/// the counts; the task ends once every clone is dropped and the queue is
/// sent.
#[derive(Debug, Clone)]
pub struct Reporter {
    queue: mpsc::Sender<Refusal>,
    counts: Arc<Counts>,
}

impl Reporter {
    /// Reports to `sink`, with a queue of [`DEFAULT_QUEUE`]. Spawns its task
    /// on the current tokio runtime (so it must be called inside one).
    pub fn new(sink: impl RefusalSink) -> Reporter {
        Reporter::with_queue(sink, DEFAULT_QUEUE)
    }

    /// [`Reporter::new`] with a queue of `capacity` reports (at least 1).
    pub fn with_queue(sink: impl RefusalSink, capacity: usize) -> Reporter {
        let (queue, rx) = mpsc::channel(capacity.max(1));
        let counts = Arc::new(Counts::default());
        tokio::spawn(send_all(sink, rx, counts.clone()));
        Reporter { queue, counts }
    }

    /// Report that the fence refused `stale` on `resource` under `lock`
    /// (see [`Refusal::of`]). Never waits and never fails: a full queue drops
    /// the report ([`Reporter::dropped`]).
    pub fn report(&self, lock: &str, stale: &Stale, resource: &str) {
        self.report_refusal(Refusal::of(lock, stale, resource));
    }

    /// [`Reporter::report`] of a report built by the caller.
    pub fn report_refusal(&self, refusal: Refusal) {
        if let Err(e) = self.queue.try_send(refusal) {
            self.counts.dropped.fetch_add(1, Relaxed);
            let refusal = match &e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            tracing::debug!(lock = %refusal.lock, refused = refusal.refused, "refusal report dropped: the queue is full");
        }
    }

    /// Reports the lock service took.
    pub fn sent(&self) -> u64 {
        self.counts.sent.load(Relaxed)
    }

    /// Reports the lock service refused or could not be asked about.
    pub fn failed(&self) -> u64 {
        self.counts.failed.load(Relaxed)
    }

    /// Reports dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Relaxed)
    }
}

/// The reporter's task: each queued report to `sink`, one at a time.
async fn send_all(sink: impl RefusalSink, mut rx: mpsc::Receiver<Refusal>, counts: Arc<Counts>) {
    while let Some(r) = rx.recv().await {
        match sink.report_refusal(&r).await {
            Ok(()) => counts.sent.fetch_add(1, Relaxed),
            Err(e) => {
                tracing::debug!(lock = %r.lock, refused = r.refused, highest = r.highest, error = %e, "refusal report failed");
                counts.failed.fetch_add(1, Relaxed)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Access;
    use std::sync::Mutex;
    use tokio::sync::Semaphore;

    fn stale(got: u64, highest: u64) -> Stale {
        Stale { access: Access::Write, highest, got }
    }

    /// The lock service, reduced to the reports it took; each waits for a
    /// permit of `gate` (none: at once), and a lock named "refuse" is refused.
    #[derive(Default)]
    struct Service {
        took: Mutex<Vec<Refusal>>,
        gate: Option<Arc<Semaphore>>,
        started: tokio::sync::Notify,
    }

    #[async_trait]
    impl RefusalSink for Service {
        async fn report_refusal(&self, r: &Refusal) -> Result<(), BoxError> {
            self.started.notify_one();
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("the gate stays open").forget();
            }
            if r.lock == "refuse" {
                return Err("permission denied: storage-1 may not check lock \"refuse\"".into());
            }
            self.took.lock().unwrap().push(r.clone());
            Ok(())
        }
    }

    /// Until `reporter` has sent or failed `n` reports.
    async fn settled(reporter: &Reporter, n: u64) {
        for _ in 0..1000 {
            if reporter.sent() + reporter.failed() >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("{n} reports never settled: sent {}, failed {}", reporter.sent(), reporter.failed());
    }

    /// Rule: every report reaches the lock service, in order, with the lock,
    /// the refused token, the fence's highest and the resource; one the
    /// service refuses is counted as failed and the next ones go on.
    #[tokio::test]
    async fn reports_reach_the_service_in_order_and_failures_are_counted() {
        let service = Arc::new(Service::default());
        let reporter = Reporter::new(service.clone());
        reporter.report("orders", &stale(5, 9), "orders-42");
        reporter.report("refuse", &stale(1, 2), "x");
        reporter.clone().report("orders", &stale(6, 9), "");
        settled(&reporter, 3).await;
        let took = service.took.lock().unwrap().clone();
        let want =
            |refused, resource: &str| Refusal { lock: "orders".into(), refused, highest: 9, resource: resource.into() };
        assert_eq!(took, vec![want(5, "orders-42"), want(6, "")]);
        assert_eq!((reporter.sent(), reporter.failed(), reporter.dropped()), (2, 1, 0));
    }

    /// Rule: `report` never waits for the service: while the service holds
    /// one report, the queue takes `capacity` more and drops (and counts) the
    /// rest, and once the service answers again the queued ones are sent.
    #[tokio::test]
    async fn a_slow_service_never_blocks_the_caller_and_overflow_is_dropped() {
        let gate = Arc::new(Semaphore::new(0));
        let service = Arc::new(Service { gate: Some(gate.clone()), ..Service::default() });
        let reporter = Reporter::with_queue(service.clone(), 4);
        reporter.report("orders", &stale(1, 100), "k");
        tokio::time::timeout(std::time::Duration::from_secs(10), service.started.notified()).await.unwrap();
        // The first is with the service (held at the gate): 4 fit the queue.
        for t in 2..=11 {
            reporter.report("orders", &stale(t, 100), "k");
        }
        assert_eq!(reporter.dropped(), 6);
        gate.add_permits(100);
        settled(&reporter, 5).await;
        let refused: Vec<u64> = service.took.lock().unwrap().iter().map(|r| r.refused).collect();
        assert_eq!(refused, vec![1, 2, 3, 4, 5]);
        assert_eq!((reporter.sent(), reporter.failed(), reporter.dropped()), (5, 0, 6));
    }

    /// Rule: a report carries what the lock service takes: a resource cut
    /// to 256 bytes at a character boundary, control characters replaced.
    #[test]
    fn a_long_or_odd_resource_is_made_reportable() {
        let r = Refusal::of("l", &stale(3, 4), &"é".repeat(200));
        assert_eq!((r.resource.len(), r.resource.chars().count()), (256, 128));
        let r = Refusal::of("l", &stale(3, 4), "a\nb\0c");
        assert_eq!(r.resource, "a\u{fffd}b\u{fffd}c");
        assert_eq!((r.lock.as_str(), r.refused, r.highest), ("l", 3, 4));
    }
}
