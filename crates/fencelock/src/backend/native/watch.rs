//! [`Client::watch`]: a task that keeps one `Watch` stream open on some server
//! of the list and hands its events to a [`WatchStream`].
//!
//! No gap, no duplicate: the task remembers the revision after the last event
//! it handed on (or the start revision the server announced before any event)
//! and, when the stream breaks or the server fails, opens a new one *from*
//! that revision (inclusive) on the server the leader hint names or the next
//! one of the list, after a backoff. Every node numbers events the same way
//! (by log index), so the new server continues exactly where the old one
//! stopped, or waits until it has applied that far.

use fencelock_proto::v1 as pb;
use tonic::{Code, Status};

use super::rpc::Rpc;
use super::wire::leader_hint;
use super::Client;
use crate::error::{is_retryable, Error};
use crate::watch::{Revision, WatchEvent, WatchKind, WatchStream};

/// Events a watch buffers before its task waits for the reader.
const BUFFER: usize = 256;

/// gRPC metadata of a `compacted` error: the oldest revision available.
const OLDEST_KEY: &str = "fencelock-oldest-revision";

type Out = tokio::sync::mpsc::Sender<Result<WatchEvent, Error>>;

impl Client {
    /// Watches every lock whose name starts with `prefix` ("" = all), from the
    /// events applied after the watch starts.
    pub fn watch(&self, prefix: impl Into<String>) -> WatchStream {
        self.watch_from(prefix, None)
    }

    /// [`Client::watch`] from `from` (inclusive): to resume after an event
    /// `e`, pass `e.revision.next()`. A revision the server no longer holds
    /// ends the stream with [`Error::Compacted`].
    pub fn watch_from(&self, prefix: impl Into<String>, from: Option<Revision>) -> WatchStream {
        self.watch_selected(Selected::Prefix(prefix.into()), from)
    }

    /// The events of the one lock `name` from `from` (inclusive).
    pub(crate) fn watch_lock(&self, name: &str, from: Option<Revision>) -> WatchStream {
        self.watch_selected(Selected::Name(name.to_string()), from)
    }

    /// The first revision a watch of `name` opened now would deliver (the
    /// server's start message): a watch from it misses nothing that a read
    /// made after this call does not show.
    pub(crate) async fn start_revision(&self, name: &str) -> Result<Revision, Error> {
        let rpc = &self.inner.rpc;
        let msg = Selected::Name(name.to_string()).request(None);
        let mut stream = rpc
            .call("watch", rpc.deadline(), |mut c, left| {
                let req = super::wire::request(msg.clone(), left);
                async move { c.watch(req).await }
            })
            .await?;
        let first = stream.message().await.map_err(|s| Error::from_status(&s))?;
        match first.and_then(|ev| ev.revision.filter(|_| ev.kind == pb::WatchEventKind::Start as i32)) {
            Some(r) => Ok(Revision { index: r.index, seq: r.seq }),
            None => Err(Error::Protocol("a watch did not start with its start revision".into())),
        }
    }

    fn watch_selected(&self, selected: Selected, from: Option<Revision>) -> WatchStream {
        let (tx, rx) = tokio::sync::mpsc::channel(BUFFER);
        let task = tokio::spawn(run(self.inner.rpc.clone(), selected, from, tx));
        WatchStream::new(rx, task.abort_handle())
    }
}

/// Which locks a watch follows.
#[derive(Debug, Clone)]
enum Selected {
    /// Every lock whose name starts with this.
    Prefix(String),
    /// This lock only.
    Name(String),
}

impl Selected {
    fn request(&self, from: Option<Revision>) -> pb::WatchRequest {
        let from = from.map(|r| pb::Revision { index: r.index, seq: r.seq });
        match self {
            Selected::Prefix(prefix) => pb::WatchRequest { prefix: prefix.clone(), name: String::new(), from },
            Selected::Name(name) => pb::WatchRequest { prefix: String::new(), name: name.clone(), from },
        }
    }
}

/// How one stream ended.
enum Ended {
    /// The reader is gone, or an error it cannot get past was handed on.
    Done,
    /// Try again (elsewhere), from the remembered revision.
    Retry(Option<String>),
}

async fn run(rpc: Rpc, selected: Selected, mut next: Option<Revision>, out: Out) {
    let mut failures = 0u32;
    loop {
        let (gen, client) = rpc.current();
        let (ended, delivered) = stream_once(client, &selected, &mut next, &out).await;
        let hint = match ended {
            Ended::Done => return,
            Ended::Retry(hint) => hint,
        };
        failures = if delivered { 0 } else { failures.saturating_add(1) };
        let moved = rpc.fail_over(gen, hint);
        if !moved || failures > 1 {
            tokio::time::sleep(rpc.backoff().delay(failures, fastrand::f64())).await;
        }
    }
}

/// One `Watch` call, until it ends; whether it handed on anything.
async fn stream_once(
    mut client: super::wire::Grpc,
    selected: &Selected,
    next: &mut Option<Revision>,
    out: &Out,
) -> (Ended, bool) {
    let req = selected.request(*next);
    let mut stream = match client.watch(req).await {
        Ok(resp) => resp.into_inner(),
        Err(status) => return (failed(&status, out).await, false),
    };
    let mut delivered = false;
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            // The server ended the stream (it is shutting down): go on elsewhere.
            Ok(None) => return (Ended::Retry(None), delivered),
            Err(status) => return (failed(&status, out).await, delivered),
        };
        let Some(rev) = ev.revision.map(|r| Revision { index: r.index, seq: r.seq }) else { continue };
        if ev.kind == pb::WatchEventKind::Start as i32 {
            next.get_or_insert(rev);
            continue;
        }
        let Some(event) = decode(ev, rev) else { continue };
        *next = Some(rev.next());
        // Only events count as progress: a server that opens streams and
        // ends them at once (it is stopping) is backed off from.
        delivered = true;
        if out.send(Ok(event)).await.is_err() {
            return (Ended::Done, delivered);
        }
    }
}

/// What a failed call means for the watch: hand on a final error, or retry.
async fn failed(status: &Status, out: &Out) -> Ended {
    if let Some(oldest) = compacted(status) {
        let _ = out.send(Err(Error::Compacted { oldest })).await;
        return Ended::Done;
    }
    let final_code = matches!(
        status.code(),
        Code::InvalidArgument | Code::OutOfRange | Code::PermissionDenied | Code::Unauthenticated | Code::Unimplemented
    );
    if final_code && !is_retryable(status) && leader_hint(status).is_none() {
        let _ = out.send(Err(Error::from_status(status))).await;
        return Ended::Done;
    }
    Ended::Retry(leader_hint(status))
}

/// The oldest revision a `compacted` error names.
fn compacted(status: &Status) -> Option<Revision> {
    if status.code() != Code::OutOfRange || !status.message().starts_with("compacted") {
        return None;
    }
    let from_meta = status.metadata().get(OLDEST_KEY).and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = from_meta.or_else(|| status.message().rsplit(' ').next().map(str::to_string))?;
    text.parse().ok()
}

/// A wire event as the crate's; `None` for a kind this client does not know.
fn decode(ev: pb::WatchEvent, revision: Revision) -> Option<WatchEvent> {
    let kind = match pb::WatchEventKind::try_from(ev.kind).ok()? {
        pb::WatchEventKind::Granted => WatchKind::Granted,
        pb::WatchEventKind::Released => WatchKind::Released,
        pb::WatchEventKind::Expired => WatchKind::Expired,
        pb::WatchEventKind::Revoked => WatchKind::Revoked,
        pb::WatchEventKind::Queued => WatchKind::Queued,
        pb::WatchEventKind::Dequeued => WatchKind::Dequeued,
        pb::WatchEventKind::ValueChanged => WatchKind::ValueChanged,
        pb::WatchEventKind::Downgraded => WatchKind::Downgraded,
        pb::WatchEventKind::WriteRefused => WatchKind::WriteRefused,
        pb::WatchEventKind::Start | pb::WatchEventKind::Unspecified => return None,
    };
    Some(WatchEvent {
        revision,
        kind,
        lock: ev.lock,
        lease_id: ev.lease_id,
        token: ev.token,
        identity: ev.identity,
        reason: ev.reason,
        value: ev.value,
        mode: match pb::LockMode::try_from(ev.mode) {
            Ok(pb::LockMode::Shared) => crate::LockMode::Shared,
            _ => crate::LockMode::Exclusive,
        },
        highest_token: ev.highest_token,
        resource: ev.resource,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compacted_status(with_meta: bool) -> Status {
        let mut s = Status::out_of_range("compacted: oldest available revision is 42.3");
        if with_meta {
            s.metadata_mut().insert(OLDEST_KEY, "42.3".parse().unwrap());
        }
        s
    }

    /// Rule: the server's `compacted` error reaches the user as
    /// `Error::Compacted` with the oldest revision (from the metadata, or the
    /// message), and ends the watch; it is never retried.
    #[tokio::test]
    async fn compacted_ends_the_watch_with_the_oldest_revision() {
        for with_meta in [true, false] {
            let (tx, mut rx) = tokio::sync::mpsc::channel(1);
            assert!(matches!(failed(&compacted_status(with_meta), &tx).await, Ended::Done));
            let err = rx.recv().await.expect("an error is handed on");
            assert_eq!(err, Err(Error::Compacted { oldest: Revision { index: 42, seq: 3 } }));
        }
    }

    /// Rules: a refusal ends the watch with its error; an unavailable server
    /// (or a follower naming the leader) is retried, with the hint.
    #[tokio::test]
    async fn refusals_end_the_watch_and_unavailable_is_retried() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        assert!(matches!(failed(&Status::permission_denied("no read on \"\""), &tx).await, Ended::Done));
        assert!(matches!(rx.recv().await, Some(Err(Error::PermissionDenied(_)))));
        assert!(matches!(failed(&Status::unavailable("stopping"), &tx).await, Ended::Retry(None)));
        let mut hinted = Status::unavailable("not the leader");
        hinted.metadata_mut().insert(super::super::wire::LEADER_HEADER, "10.0.0.2:7070".parse().unwrap());
        assert!(matches!(failed(&hinted, &tx).await, Ended::Retry(Some(h)) if h == "10.0.0.2:7070"));
        assert!(rx.try_recv().is_err(), "nothing is handed on for a retry");
    }
}
