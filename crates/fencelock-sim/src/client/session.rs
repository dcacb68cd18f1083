//! A client's view of its lease: a conservative deadline, and the keep-alive task.
//!
//! The deadline is measured from the *send* time of the first attempt of the
//! request that the server acknowledged (GrantLease or KeepAlive), plus the TTL.
//! The server stamps the lease later than that send, so its deadline is never
//! earlier than the client's: while the client's deadline has not passed, the
//! server has not expired the lease. Once the deadline passes the lease is lost
//! for good: a late acknowledgement does not revive it.

use std::{cell::RefCell, collections::BTreeMap, rc::Rc};

use fencelock_core::{Command, EngineError, LeaseId, Millis, Reply, RequestId};

use super::conn::ServerConn;
use crate::{
    clock::{now_ms, sleep_ms, sleep_until_ms},
    event::{EventKind, Events},
};

/// The lease a client currently uses.
#[derive(Debug, Clone, Copy)]
struct Current {
    id: LeaseId,
    deadline: Millis,
}

/// Lease state shared by a client's worker and keep-alive tasks.
#[derive(Debug)]
pub struct Session {
    pub client: usize,
    events: Events,
    current: Option<Current>,
    /// When the client stopped trusting each lease it gave up.
    ended: BTreeMap<LeaseId, Millis>,
    next_req: u64,
    /// The client is paused (does nothing at all) until this instant.
    paused_until: Millis,
}

pub type SharedSession = Rc<RefCell<Session>>;

impl Session {
    pub fn new(client: usize, events: Events) -> Self {
        Self { client, events, current: None, ended: BTreeMap::new(), next_req: 0, paused_until: 0 }
    }

    /// A fresh request id, unique across all clients (the client index is in the
    /// high bits; `GrantLease` ids are global in the engine).
    pub fn req(&mut self) -> RequestId {
        self.next_req += 1;
        let client = u64::try_from(self.client).unwrap_or(u64::MAX >> 32);
        RequestId(((client + 1) << 32) | self.next_req)
    }

    /// The current lease, if its deadline has not passed. A passed one is dropped.
    pub fn live_lease(&mut self) -> Option<LeaseId> {
        let cur = self.current?;
        if now_ms() < cur.deadline {
            return Some(cur.id);
        }
        self.lose(cur.id);
        None
    }

    /// `lease` is the current lease and its deadline has not passed.
    pub fn is_live(&self, lease: LeaseId) -> bool {
        self.current.is_some_and(|c| c.id == lease && now_ms() < c.deadline)
    }

    /// The deadline of `lease` if it is the current, live lease.
    pub fn live_deadline(&self, lease: LeaseId) -> Option<Millis> {
        self.current.filter(|c| c.id == lease && now_ms() < c.deadline).map(|c| c.deadline)
    }

    /// The instant the client's belief in `lease` ends if it stops now: now while
    /// the lease is live, else the instant it ended (its deadline, at the latest).
    pub fn belief_end(&self, lease: LeaseId) -> Millis {
        let now = now_ms();
        match self.current {
            Some(c) if c.id == lease => now.min(c.deadline),
            _ => self.ended.get(&lease).copied().unwrap_or(now).min(now),
        }
    }

    pub fn set_lease(&mut self, id: LeaseId, deadline: Millis) {
        if let Some(old) = self.current {
            self.lose(old.id);
        }
        self.current = Some(Current { id, deadline });
        let client = self.client;
        self.events.push(EventKind::ClientLease { client, lease: id, deadline });
    }

    /// A keep-alive sent at `sent` was acknowledged: the deadline moves to
    /// `sent + ttl`, unless the lease was already lost.
    pub fn extend(&mut self, lease: LeaseId, deadline: Millis) {
        let now = now_ms();
        if let Some(c) = self.current.as_mut().filter(|c| c.id == lease && now < c.deadline) {
            c.deadline = c.deadline.max(deadline);
        }
    }

    /// Stop trusting `lease` (its deadline passed, or the server says it is gone).
    pub fn lose(&mut self, lease: LeaseId) {
        let Some(c) = self.current.filter(|c| c.id == lease) else {
            return;
        };
        self.ended.insert(lease, now_ms().min(c.deadline));
        self.current = None;
        let client = self.client;
        self.events.push(EventKind::ClientLeaseLost { client, lease });
    }

    pub fn pause_until(&mut self, until: Millis) {
        self.paused_until = until;
    }
}

/// Wait out a pause, if the client is paused.
pub async fn gate(session: &SharedSession) {
    let until = session.borrow().paused_until;
    sleep_until_ms(until).await;
}

/// The keep-alive task: every `every_ms`, renew the current lease.
pub async fn keepalive(session: SharedSession, mut conn: ServerConn, every_ms: u64, backoff_ms: u64) {
    loop {
        sleep_ms(every_ms).await;
        gate(&session).await;
        let lease = session.borrow_mut().live_lease();
        if let Some(lease) = lease {
            renew(&session, &mut conn, lease, backoff_ms).await;
        }
    }
}

/// Renew `lease`, retrying the same request id until it is answered or the lease
/// is lost. The new deadline counts from the first send.
async fn renew(session: &SharedSession, conn: &mut ServerConn, lease: LeaseId, backoff_ms: u64) {
    let req = session.borrow_mut().req();
    let sent = now_ms();
    while session.borrow().is_live(lease) {
        let res = conn.call(Command::KeepAlive { req, lease }).await;
        gate(session).await;
        match res {
            Ok(Reply::LeaseKept { ttl_ms, .. }) => return session.borrow_mut().extend(lease, sent + ttl_ms),
            Ok(Reply::Rejected(EngineError::LeaseNotFound(_))) => return session.borrow_mut().lose(lease),
            Ok(_) => return,
            Err(_) => sleep_ms(backoff_ms).await,
        }
    }
}
