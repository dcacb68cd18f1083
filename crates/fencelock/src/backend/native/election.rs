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
//! Observing without a gap: the watch's start revision is taken first, then
//! the leader is read, then the watch runs from that revision. Every change
//! after the read is delivered; changes the read already showed are delivered
//! again and dropped as old news by the term filter.

use super::Client;
use crate::backend::{leader_stream, Leader, LeaderEvent, LeaderSink, LeaderStream};
use crate::error::Error;
use crate::watch::{WatchEvent, WatchKind};

impl Client {
    /// The leader of the election `name`: the holder of its lock, if any.
    pub(crate) async fn leader_of(&self, name: &str) -> Result<Option<Leader>, Error> {
        let info = self.describe(name).await?;
        Ok(info.holder.map(|h| Leader { name: info.name, term: h.token, value: h.value, identity: h.identity }))
    }

    /// The changes of the election `name` from now on, the current leader first.
    pub(crate) async fn observe_election(&self, name: &str) -> Result<LeaderStream, Error> {
        crate::backend::check_name(name)?;
        let from = self.start_revision(name).await?;
        let current = self.leader_of(name).await?;
        let client = self.clone();
        let name = name.to_string();
        Ok(leader_stream(move |sink| follow(client, name, from, current, sink)))
    }
}

async fn follow(client: Client, name: String, from: crate::Revision, current: Option<Leader>, mut sink: LeaderSink) {
    if let Some(leader) = current {
        if !sink.send(LeaderEvent::Leader(leader)).await {
            return;
        }
    }
    let mut events = client.watch_lock(&name, Some(from));
    while let Some(event) = events.next_event().await {
        let change = match event {
            Ok(event) => change_of(event),
            Err(e) => return sink.fail(e).await,
        };
        if let Some(change) = change {
            if !sink.send(change).await {
                return;
            }
        }
    }
}

/// What a watch event of the election's lock means for its leadership.
fn change_of(ev: WatchEvent) -> Option<LeaderEvent> {
    match ev.kind {
        WatchKind::Granted => Some(LeaderEvent::Leader(Leader {
            name: ev.lock,
            term: ev.token,
            // Filled in by the merge of the watch events' values.
            value: Vec::new(),
            identity: (!ev.identity.is_empty()).then_some(ev.identity),
        })),
        WatchKind::Released | WatchKind::Expired | WatchKind::Revoked => Some(LeaderEvent::Vacant { term: ev.token }),
        WatchKind::Queued | WatchKind::Dequeued => None,
    }
}
