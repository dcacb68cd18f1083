//! One caller's watch: a hub [`Subscription`] filtered to the locks the caller
//! asked for and may read, fed into a bounded channel by a task of its own.
//! The `Watch` RPC ([`crate::grpc`]) and `GET /v1/watch` ([`crate::admin`])
//! both serve from it.
//!
//! Authorization follows `ListLocks`/`DescribeLock`: a watch of a prefix needs
//! `read` on the whole prefix, of one lock `read` on that lock (checked by the
//! caller of [`start`] through [`Selector::required`]). A watch lives long, so
//! before each batch of events it authenticates its caller again, against the
//! auth file and the group's policy as they are then (a [`Caller`]), as a
//! session stream does each operation: a token removed from the file, or a
//! read taken from the identity's rules, ends the watch with that refusal.
//! Each event is checked against the caller before it is sent, so no event
//! of a lock the caller may not read is ever sent: a `write_refused` event
//! (a fence's report) is an event of its lock, and needs `read` on it like
//! the others.

use std::sync::Arc;

use fencelock_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tonic::Status;

use super::{Compacted, Event, Hub, Kind, Rev, WatchError};
use crate::access::auth::{Refusal, Verb, Who};

/// Events a watch buffers for its caller; a caller slower than this makes
/// its watch read the hub's history again, and fall behind it in the end.
const OUT_BUFFER: usize = 256;

/// Which locks a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every lock whose name starts with this ("" = all).
    Prefix(String),
    /// This one lock.
    Name(String),
}

impl Selector {
    /// `name` when given, else `prefix`.
    pub fn new(prefix: String, name: String) -> Selector {
        if name.is_empty() {
            Selector::Prefix(prefix)
        } else {
            Selector::Name(name)
        }
    }

    fn selects(&self, lock: &str) -> bool {
        match self {
            Selector::Prefix(p) => lock.starts_with(p.as_str()),
            Selector::Name(n) => lock == n,
        }
    }

    /// The permission a watch of these locks needs.
    pub fn required(&self, who: &Who) -> Result<(), Refusal> {
        match self {
            Selector::Prefix(p) => who.require_prefix(Verb::Read, p),
            Selector::Name(n) => who.require(Verb::Read, n),
        }
    }
}

/// What a watch serves from: the node's hub, and the node's stop signal
/// (open watches end when it turns true, so a shutdown does not wait on them).
#[derive(Debug, Clone)]
pub struct Source {
    pub hub: Arc<Hub>,
    pub stop: watch::Receiver<bool>,
}

/// Who the watch's caller is now: its credentials authenticated against the
/// auth file and the group's policy as they are at each call.
pub type Caller = Box<dyn Fn() -> Result<Who, Refusal> + Send + Sync>;

/// Why a watch ended before its caller left.
#[derive(Debug)]
pub enum Ended {
    /// It fell behind the hub's history.
    Compacted(Compacted),
    /// Its caller is no longer allowed to read what it watches.
    Refused(Refusal),
}

/// What a watch yields: events, then possibly why it [`Ended`].
pub type Item = Result<Arc<Event>, Ended>;

/// Starts a watch of `selector` for `caller` from `from` (inclusive; `None`:
/// from the next applied entry); returns the first revision it delivers, and
/// its items. It ends when `stop` turns true, when the receiver is dropped, or
/// after an [`Ended`] item.
pub fn start(
    hub: &Arc<Hub>,
    caller: Caller,
    selector: Selector,
    from: Option<Rev>,
    stop: watch::Receiver<bool>,
) -> Result<(Rev, mpsc::Receiver<Item>), WatchError> {
    let sub = hub.subscribe(from)?;
    let first = sub.position();
    let (tx, rx) = mpsc::channel(OUT_BUFFER);
    // A watch of one lock counts as its follower while it lives.
    let following = match &selector {
        Selector::Name(name) => Some(hub.follow(name)),
        Selector::Prefix(_) => None,
    };
    tokio::spawn(async move {
        forward(sub, caller, selector, tx, stop).await;
        drop(following);
    });
    Ok((first, rx))
}

async fn forward(
    mut sub: super::Subscription,
    caller: Caller,
    selector: Selector,
    tx: mpsc::Sender<Item>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let batch = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tx.closed() => return,
            b = sub.recv() => b,
        };
        let events = match batch {
            Ok(Some(events)) => events,
            Ok(None) => return,
            Err(c) => {
                let _ = tx.send(Err(Ended::Compacted(c))).await;
                return;
            }
        };
        let who = match caller().and_then(|who| selector.required(&who).map(|()| who)) {
            Ok(who) => who,
            Err(refused) => {
                let _ = tx.send(Err(Ended::Refused(refused))).await;
                return;
            }
        };
        let visible =
            events.into_iter().filter(|e| selector.selects(&e.lock) && who.require(Verb::Read, &e.lock).is_ok());
        for e in visible {
            if tx.send(Ok(e)).await.is_err() {
                return;
            }
        }
    }
}

/// The response stream of the `Watch` RPC.
pub type PbStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

/// gRPC metadata key of a `compacted` error: the oldest revision available.
pub const OLDEST_KEY: &str = "fencelock-oldest-revision";

/// The `Watch` RPC of a caller already allowed to watch `selector`: streams.
pub fn grpc(
    hub: &Arc<Hub>,
    caller: Caller,
    selector: Selector,
    from: Option<pb::Revision>,
    stop: watch::Receiver<bool>,
) -> Result<PbStream, Status> {
    let from = from.map(|f| Rev { index: f.index, seq: f.seq });
    let (first, rx) = start(hub, caller, selector, from, stop).map_err(watch_status)?;
    let start = pb::WatchEvent {
        revision: Some(pb::Revision { index: first.index, seq: first.seq }),
        kind: pb::WatchEventKind::Start as i32,
        ..Default::default()
    };
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|item| match item {
        Ok(e) => Ok(to_pb(&e)),
        Err(Ended::Compacted(c)) => Err(watch_status(c.into())),
        Err(Ended::Refused(r)) => Err(r.into()),
    });
    Ok(Box::pin(tokio_stream::once(Ok(start)).chain(events)))
}

/// The status a [`WatchError`] reaches a gRPC caller as.
pub fn watch_status(e: WatchError) -> Status {
    match e {
        WatchError::Compacted(c) => {
            let mut s = Status::out_of_range(c.to_string());
            if let Ok(v) = c.oldest.to_string().parse() {
                s.metadata_mut().insert(OLDEST_KEY, v);
            }
            s
        }
        WatchError::TooManyWatchers => Status::resource_exhausted(e.to_string()),
    }
}

/// An event as the wire carries it.
pub fn to_pb(e: &Event) -> pb::WatchEvent {
    pb::WatchEvent {
        revision: Some(pb::Revision { index: e.rev.index, seq: e.rev.seq }),
        kind: to_pb_kind(e.kind) as i32,
        lock: e.lock.clone(),
        lease_id: e.lease,
        token: e.token,
        identity: e.identity.clone(),
        reason: e.reason.to_string(),
        value: e.value.clone(),
        mode: if e.shared { pb::LockMode::Shared } else { pb::LockMode::Exclusive } as i32,
        highest_token: e.highest,
        resource: e.resource.clone(),
    }
}

fn to_pb_kind(k: Kind) -> pb::WatchEventKind {
    match k {
        Kind::Granted => pb::WatchEventKind::Granted,
        Kind::Released => pb::WatchEventKind::Released,
        Kind::Expired => pb::WatchEventKind::Expired,
        Kind::Revoked => pb::WatchEventKind::Revoked,
        Kind::Queued => pb::WatchEventKind::Queued,
        Kind::Dequeued => pb::WatchEventKind::Dequeued,
        Kind::ValueChanged => pb::WatchEventKind::ValueChanged,
        Kind::Downgraded => pb::WatchEventKind::Downgraded,
        Kind::WriteRefused => pb::WatchEventKind::WriteRefused,
    }
}
