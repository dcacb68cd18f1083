//! The `WatchLeases` stream: the end of a lease pushed to its owner.
//!
//! Where it sits: between the gRPC glue (`grpc.rs`) and the driver, which
//! publishes every lease end the leader applies ([`LeaseEnd`]) on a bounded
//! broadcast. A call is checked like a keep-alive (authenticated, rate-limited,
//! and only the lease's owner may watch it: [`fencelock_core::Engine::check_lease_owner`]),
//! then subscribes to the ends *before* it reads its leases, so that an end
//! between the two is never missed. Each lease gets one first event
//! (`watching` or `not_found`), then at most one end (`revoked`, `expired`).
//!
//! Bounded: at most [`MAX_WATCHED`] leases per call; each stream's channel
//! holds every event it can ever send (two per lease, and the closing status),
//! so a slow client never makes it grow; a subscriber that falls more than
//! [`crate::driver::LEASE_END_BUFFER`] ends behind the broadcast is cut off
//! with UNAVAILABLE. A stream ends OK once all its leases ended, and
//! UNAVAILABLE when this node stops leading (naming the leader), shuts down,
//! or cut it off: the client subscribes again, and meanwhile relies on its
//! keep-alives, which stay the source of truth for its deadline.
//!
//! An open stream authenticates its caller again before it sends each end,
//! against the auth file as it is then (as a session stream does before each
//! operation and a lock watch before each batch): a token removed from the
//! file ends its stream with `Unauthenticated`, and the end that found it
//! removed is not sent.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_core::{EngineError, LeaseId};
use fencelock_proto::v1::{self as pb, lease_event::Kind};
use tokio::sync::{broadcast, mpsc, watch};
use tonic::Status;

use crate::access::auth::Who;
use crate::api::{driver_status, engine_status, Ops};
use crate::driver::{DriverError, LeaseEnd, LeaseEndCause};
use crate::watching::serve::Caller;

/// Most lease ids one call may watch.
pub const MAX_WATCHED: usize = 64;

/// What one stream sends.
pub type Out = mpsc::Receiver<Result<pb::LeaseEvent, Status>>;

/// A checked subscription, before its task runs.
pub struct Watch {
    ends: broadcast::Receiver<LeaseEnd>,
    first: Vec<pb::LeaseEvent>,
    /// Leases that were live at subscription and have not ended yet.
    live: BTreeSet<LeaseId>,
}

impl Ops {
    /// Checks `r` for `who` and subscribes to the ends of its leases.
    pub async fn watch_leases(&self, who: &Who, r: pb::WatchLeasesRequest) -> Result<Watch, Status> {
        self.allow(who, |_| Ok(()))?;
        let ids = lease_ids(&r)?;
        let ends = self.driver.lease_ends();
        self.linearizable().await?;
        let now = self.clock.now();
        let leader_term = self.leader_term();
        let caller = who.caller();
        let infos = self.read(|e| {
            let mut infos = BTreeMap::new();
            for &id in &ids {
                if let Some(c) = &caller {
                    e.check_lease_owner(c, id)?;
                }
                infos.insert(id, e.lease_info(now, id));
            }
            Ok::<_, EngineError>(infos)
        })?;
        let infos = infos.map_err(engine_status)?;
        let mut live = BTreeSet::new();
        let first = infos
            .into_iter()
            .map(|(id, info)| {
                let kind = match info {
                    Some(i) => {
                        live.insert(id);
                        Kind::Watching(pb::lease_event::Watching {
                            ttl_ms: i.ttl_ms,
                            ttl_left_ms: i.ttl_left_ms,
                            leader_term,
                        })
                    }
                    None => Kind::NotFound(pb::lease_event::NotFound {}),
                };
                pb::LeaseEvent { lease_id: id.0, kind: Some(kind) }
            })
            .collect();
        Ok(Watch { ends, first, live })
    }
}

/// The request's lease ids, checked: 1 to [`MAX_WATCHED`], non-zero.
fn lease_ids(r: &pb::WatchLeasesRequest) -> Result<BTreeSet<LeaseId>, Status> {
    if r.lease_ids.is_empty() {
        return Err(Status::invalid_argument("WatchLeases needs at least one lease id"));
    }
    if r.lease_ids.contains(&0) {
        return Err(Status::invalid_argument("lease id 0 is never a lease"));
    }
    let ids: BTreeSet<LeaseId> = r.lease_ids.iter().copied().map(LeaseId).collect();
    if ids.len() > MAX_WATCHED {
        return Err(Status::invalid_argument(format!("WatchLeases takes at most {MAX_WATCHED} lease ids")));
    }
    Ok(ids)
}

impl Watch {
    /// Sends the first events and starts the task that forwards the ends; the
    /// stream ends when the task does (at once if no lease was live).
    /// `caller` authenticates the stream's caller again (see the module docs).
    pub fn spawn(self, ops: Ops, stop: watch::Receiver<bool>, caller: Caller) -> Out {
        // Room for every event this stream can send: it never waits for the client.
        let (tx, rx) = mpsc::channel(self.first.len() + self.live.len() + 1);
        for &e in &self.first {
            let _ = tx.try_send(Ok(e));
        }
        if !self.live.is_empty() {
            tokio::spawn(self.forward(tx, ops, stop, caller));
        }
        rx
    }

    async fn forward(
        mut self,
        out: mpsc::Sender<Result<pb::LeaseEvent, Status>>,
        ops: Ops,
        mut stop: watch::Receiver<bool>,
        caller: Caller,
    ) {
        let mut ready = ops.driver.ready_watch();
        let closing = loop {
            tokio::select! {
                biased;
                _ = out.closed() => return,
                _ = stop.wait_for(|s| *s) => break shutting_down(),
                _ = ready.wait_for(|r| !*r) => break driver_status(DriverError::NotLeader { leader: ops.other_leader() }),
                end = self.ends.recv() => match end {
                    Ok(end) => {
                        if self.live.remove(&end.lease) {
                            if let Err(refusal) = caller() {
                                break refusal.into();
                            }
                            let _ = out.try_send(Ok(event(end)));
                        }
                        if self.live.is_empty() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        break Status::unavailable(format!("fell {n} lease events behind; watch again"))
                    }
                    Err(broadcast::error::RecvError::Closed) => break shutting_down(),
                },
            }
        };
        let _ = out.try_send(Err(closing));
    }
}

/// The event of a lease end.
fn event(end: LeaseEnd) -> pb::LeaseEvent {
    let kind = match end.cause {
        LeaseEndCause::Revoked => Kind::Revoked(pb::lease_event::Revoked {}),
        LeaseEndCause::Expired => Kind::Expired(pb::lease_event::Expired {}),
    };
    pb::LeaseEvent { lease_id: end.lease.0, kind: Some(kind) }
}

/// The gauge of open streams, in the Prometheus text format.
pub fn render_metrics(out: &mut String, streams: usize) {
    use std::fmt::Write;
    let name = "fencelock_lease_event_streams";
    let _ = writeln!(out, "# HELP {name} Open WatchLeases streams (lease events pushed to holders).");
    let _ = writeln!(out, "# TYPE {name} gauge\n{name} {streams}");
}

fn shutting_down() -> Status {
    Status::unavailable("server is shutting down")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> pb::WatchLeasesRequest {
        pb::WatchLeasesRequest { lease_ids: ids.to_vec() }
    }

    /// Bounded input: 1 to MAX_WATCHED non-zero ids; duplicates count once.
    #[test]
    fn lease_ids_are_checked() {
        assert_eq!(lease_ids(&req(&[])).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(lease_ids(&req(&[5, 0])).unwrap_err().code(), tonic::Code::InvalidArgument);
        let many: Vec<u64> = (1..=MAX_WATCHED as u64 + 1).collect();
        assert_eq!(lease_ids(&req(&many)).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(lease_ids(&req(&many[..MAX_WATCHED])).unwrap().len(), MAX_WATCHED);
        let twice: Vec<u64> = std::iter::repeat_n(7, MAX_WATCHED + 5).collect();
        assert_eq!(lease_ids(&req(&twice)).unwrap(), BTreeSet::from([LeaseId(7)]));
    }

    #[test]
    fn ends_become_their_events() {
        let l = LeaseId(9);
        let revoked = event(LeaseEnd { lease: l, cause: LeaseEndCause::Revoked });
        assert_eq!(revoked, pb::LeaseEvent { lease_id: 9, kind: Some(Kind::Revoked(pb::lease_event::Revoked {})) });
        let expired = event(LeaseEnd { lease: l, cause: LeaseEndCause::Expired });
        assert_eq!(expired, pb::LeaseEvent { lease_id: 9, kind: Some(Kind::Expired(pb::lease_event::Expired {})) });
    }
}
