//! Leader election on the fencelock server: the leader is the holder of the
//! election's lock ([`Client::leader_of`]: a linearizable describe), and an
//! observer follows it through a watch of that one lock
//! ([`Client::observe_election`]).
//!
//! Where it sits: under the native [`crate::LockBackend`] implementation
//! (`campaign`, `leader`, `observe`); the campaign itself is
//! `Client::campaign_guard` in `acquire`, and the term rule is
//! [`crate::backend::election`]'s.
//!
//! Observing without a gap or a step back: the describe answers with the
//! first watch revision after the state it shows (the server reads both under
//! one lock), and the watch runs from that revision, so it delivers exactly
//! the changes after the leader shown. A server too old to give that revision
//! is watched from a start revision taken before the describe instead (every
//! change after the read is delivered; the changes the read already showed
//! come again, and the term filter drops them as old news). If the watch falls
//! so far behind that its history is compacted, the observer reads the leader
//! again and goes on from there: it may miss intermediate values or leaders,
//! never show an older term.

use super::Client;
use crate::backend::{leader_stream, Leader, LeaderEvent, LeaderSink, LeaderStream};
use crate::error::Error;
use crate::watch::{WatchEvent, WatchKind};
use crate::Revision;

impl Client {
    /// The leader of the election `name`: the holder of its lock, if any.
    pub(crate) async fn leader_of(&self, name: &str) -> Result<Option<Leader>, Error> {
        Ok(self.leader_at(name).await?.0)
    }

    /// The leader of `name`, and the watch revision to follow it from.
    async fn leader_at(&self, name: &str) -> Result<(Option<Leader>, Revision), Error> {
        let (info, next) = self.describe_at(name).await?;
        let (info, next) = match next {
            Some(next) => (info, next),
            None => {
                let from = self.start_revision(name).await?;
                (self.describe(name).await?, from)
            }
        };
        let leader =
            info.holder.map(|h| Leader { name: info.name, term: h.token, value: h.value, identity: h.identity });
        Ok((leader, next))
    }

    /// The changes of the election `name` from now on, the current leader first.
    pub(crate) async fn observe_election(&self, name: &str) -> Result<LeaderStream, Error> {
        crate::backend::check_name(name)?;
        let start = self.leader_at(name).await?;
        let client = self.clone();
        let name = name.to_string();
        Ok(leader_stream(move |sink| follow(client, name, start, sink)))
    }
}

async fn follow(client: Client, name: String, start: (Option<Leader>, Revision), mut sink: LeaderSink) {
    let (mut current, mut from) = start;
    loop {
        if let Some(leader) = current.take() {
            if !sink.send(LeaderEvent::Leader(leader)).await {
                return;
            }
        }
        match follow_from(&client, &name, from, &mut sink).await {
            Followed::ReaderGone => return,
            Followed::Failed(Error::Compacted { .. }) => match client.leader_at(&name).await {
                Ok((leader, next)) => (current, from) = (leader, next),
                Err(e) => return sink.fail(e).await,
            },
            Followed::Failed(e) => return sink.fail(e).await,
        }
    }
}

/// How following a watch ended.
enum Followed {
    ReaderGone,
    Failed(Error),
}

/// Passes the watch's changes of `name` from `from` on until it fails or the
/// reader goes.
async fn follow_from(client: &Client, name: &str, from: Revision, sink: &mut LeaderSink) -> Followed {
    let mut events = client.watch_lock(name, Some(from));
    while let Some(event) = events.next_event().await {
        match event {
            Ok(event) => {
                if let Some(change) = change_of(event) {
                    if !sink.send(change).await {
                        return Followed::ReaderGone;
                    }
                }
            }
            Err(e) => return Followed::Failed(e),
        }
    }
    Followed::ReaderGone
}

/// What a watch event of the election's lock means for its leadership.
fn change_of(ev: WatchEvent) -> Option<LeaderEvent> {
    match ev.kind {
        // A grant is a new leader; a new value of the holder is its proclaim.
        WatchKind::Granted | WatchKind::ValueChanged => Some(LeaderEvent::Leader(Leader {
            name: ev.lock,
            term: ev.token,
            value: ev.value,
            identity: (!ev.identity.is_empty()).then_some(ev.identity),
        })),
        WatchKind::Released | WatchKind::Expired | WatchKind::Revoked => Some(LeaderEvent::Vacant { term: ev.token }),
        WatchKind::Queued | WatchKind::Dequeued | WatchKind::Downgraded | WatchKind::WriteRefused => None,
    }
}
