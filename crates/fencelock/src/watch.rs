//! Watch types: what [`crate::Client::watch`] yields. A [`WatchEvent`] is one
//! thing that happened to a lock, at a [`Revision`] (defined in `types`, as
//! errors name it too) that orders all events of the group totally; [`WatchStream`] is the stream of them, which resumes by
//! itself after a dropped stream or a failed server (see
//! `backend::native::watch`).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::error::Error;
pub use crate::types::{ParseRevisionError, Revision};

/// What happened to a lock.
///
/// # Examples
///
/// The enum may grow: match the rest with `_`.
///
/// ```no_run
/// use fencelock::{WatchEvent, WatchKind};
///
/// fn log(e: &WatchEvent) {
///     match e.kind {
///         WatchKind::Granted => println!("{}: granted to {:?} (token {})", e.lock, e.identity, e.token),
///         WatchKind::Expired | WatchKind::Revoked => println!("{}: holder lost it ({})", e.lock, e.kind),
///         WatchKind::WriteRefused => println!("{}: a fence refused token {} on {}", e.lock, e.token, e.resource),
///         _ => {}
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WatchKind {
    /// A lease got the lock (with a new fencing token).
    Granted,
    /// The holder released it (`reason` "released", or "cancelled").
    Released,
    /// The holder's lease expired.
    Expired,
    /// The holder's lease was revoked.
    Revoked,
    /// A lease queued for it.
    Queued,
    /// A queued request left the queue without the lock (`reason`
    /// "timed_out", "lease_ended" or "cancelled").
    Dequeued,
    /// The holder published a new value (same token; an elected leader's
    /// proclaim).
    ValueChanged,
    /// A writer of a read-write lock became a reader (same token); the
    /// readers it lets in follow as `Granted`.
    Downgraded,
    /// A fence reported that it refused a stale write on the lock
    /// ([`crate::Client::report_refusal`]): `token` is the refused token,
    /// `highest_token` the fence's mark that refused it, `resource` what the
    /// fence protects, `identity` who reported it. Nothing about the lock
    /// changed: a paused holder tried to write late, and the fence stopped it.
    WriteRefused,
}

impl WatchKind {
    /// Lower-case name ("granted", …).
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Granted => "granted",
            WatchKind::Released => "released",
            WatchKind::Expired => "expired",
            WatchKind::Revoked => "revoked",
            WatchKind::Queued => "queued",
            WatchKind::Dequeued => "dequeued",
            WatchKind::ValueChanged => "value_changed",
            WatchKind::Downgraded => "downgraded",
            WatchKind::WriteRefused => "write_refused",
        }
    }
}

impl fmt::Display for WatchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a watch.
///
/// # Examples
///
/// ```no_run
/// use fencelock::{Client, WatchKind};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let mut events = client.watch("leaders/");
/// while let Some(event) = events.next_event().await {
///     let event = event?;
///     if event.kind == WatchKind::ValueChanged {
///         println!("{} now publishes {}", event.lock, String::from_utf8_lossy(&event.value));
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Where the event stands in the node's history: resume a watch after it
    /// with [`Client::watch_from`](crate::Client::watch_from).
    pub revision: Revision,
    /// What happened.
    pub kind: WatchKind,
    /// The lock it happened to.
    pub lock: String,
    /// The lease of the grant or the wait; 0 for [`WatchKind::WriteRefused`]
    /// (a fence knows the refused token, not its lease).
    pub lease_id: u64,
    /// The grant's fencing token; the refused token for
    /// [`WatchKind::WriteRefused`]; 0 for queued and dequeued.
    pub token: u64,
    /// The identity the acquire carried ("" when none, and for dequeued);
    /// for [`WatchKind::WriteRefused`], the reporter's authenticated identity
    /// ("" from a server without authentication).
    pub identity: String,
    /// Why a grant or a wait ended, when the kind does not say it all.
    pub reason: String,
    /// The value the grant publishes (granted, value changed) or published
    /// (released, expired, revoked); empty otherwise.
    pub value: Vec<u8>,
    /// Shared for a reader's grant and for a downgrade; exclusive otherwise.
    pub mode: crate::LockMode,
    /// [`WatchKind::WriteRefused`]: the highest token the fence had admitted
    /// (the mark that refused `token`); 0 otherwise.
    pub highest_token: u64,
    /// [`WatchKind::WriteRefused`]: what the fence protects (a storage key;
    /// "" when the report named none); "" otherwise.
    pub resource: String,
}

/// The events of a watch, in revision order, each once. It resumes by itself
/// (from the revision after the last event, on the next server of the list
/// when one fails) and ends only with an error it cannot get past:
/// [`Error::Compacted`], a refused permission, or a bad request. Dropping it
/// ends the watch.
///
/// `T` is what it yields: [`WatchEvent`]s for [`crate::Client::watch`], an
/// election's changes for a [`crate::LeaderStream`]. Either way a task feeds
/// it, and dropping the stream stops the task.
///
/// # Examples
///
/// Watch every lock under a prefix, from now on. The stream resumes by itself
/// after a broken connection; an `Err` ends it.
///
/// ```no_run
/// use fencelock::Client;
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let mut events = client.watch("jobs/"); // "" watches every lock; drop it to stop
/// while let Some(event) = events.next_event().await {
///     let e = event?;
///     println!("{} {} {} lease={} token={}", e.revision, e.kind, e.lock, e.lease_id, e.token);
/// }
/// # Ok(()) }
/// ```
pub struct WatchStream<T = WatchEvent> {
    rx: mpsc::Receiver<Result<T, Error>>,
    task: tokio::task::AbortHandle,
}

impl<T> WatchStream<T> {
    pub(crate) fn new(rx: mpsc::Receiver<Result<T, Error>>, task: tokio::task::AbortHandle) -> Self {
        WatchStream { rx, task }
    }

    /// The next event (`None` once the watch ended after its last error).
    pub async fn next_event(&mut self) -> Option<Result<T, Error>> {
        self.rx.recv().await
    }
}

impl<T> Drop for WatchStream<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T> fmt::Debug for WatchStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream").field("ended", &self.task.is_finished()).finish_non_exhaustive()
    }
}

impl<T> tokio_stream::Stream for WatchStream<T> {
    type Item = Result<T, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}
