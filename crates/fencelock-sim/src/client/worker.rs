//! A client's work loop: get a lease, acquire the lock (waiting in the queue),
//! check the deadline, write to the resource with the token, release.
//!
//! The pause happens where Kleppmann put it: after the last deadline check and
//! before the write. The paused client then writes anyway; only the fence can
//! stop that write.

use fencelock_core::{Acquire, Command, EngineError, Grant, LeaseId, Reply, RequestId, Token};

use super::{
    conn::{ResourceConn, ServerConn},
    session::{gate, SharedSession},
    PauseCtl,
};
use crate::{
    clock::{now_ms, sleep_ms, sleep_until_ms},
    config::{SimConfig, LOCK},
    event::{EventKind, Events, HoldEnd},
    wire::{PushOutcome, WriteReq},
};

/// Upper bound of the time a holder "works" before it writes.
const THINK_MAX_MS: u64 = 60;
/// Upper bound of the idle time between two rounds.
const IDLE_MAX_MS: u64 = 120;
/// Pause after a failed request before the retry.
pub const BACKOFF_MS: u64 = 15;

pub struct Worker {
    pub session: SharedSession,
    pub server: ServerConn,
    pub resource: ResourceConn,
    pub rng: fastrand::Rng,
    pub cfg: SimConfig,
    pub pause: PauseCtl,
    pub events: Events,
}

impl Worker {
    pub async fn run(mut self) {
        loop {
            gate(&self.session).await;
            let lease = self.ensure_lease().await;
            let req = self.session.borrow_mut().req();
            if let Some(grant) = self.acquire(lease, req).await {
                self.hold(lease, grant).await;
            }
            sleep_ms(self.rng.u64(1..=IDLE_MAX_MS)).await;
        }
    }

    fn client(&self) -> usize {
        self.session.borrow().client
    }

    /// The current live lease, or a new one.
    async fn ensure_lease(&mut self) -> LeaseId {
        loop {
            if let Some(lease) = self.session.borrow_mut().live_lease() {
                return lease;
            }
            if let Some(lease) = self.grant_lease().await {
                return lease;
            }
            sleep_ms(BACKOFF_MS).await;
        }
    }

    /// Ask for a lease, retrying the same request id while a lease granted to the
    /// first attempt could still be live.
    async fn grant_lease(&mut self) -> Option<LeaseId> {
        let req = self.session.borrow_mut().req();
        let (sent, ttl_ms) = (now_ms(), self.cfg.ttl_ms);
        while now_ms() < sent + ttl_ms {
            match self.server.call(Command::GrantLease { req, ttl_ms, id: None }).await {
                Ok(Reply::LeaseGranted { lease, ttl_ms }) => {
                    self.session.borrow_mut().set_lease(lease, sent + ttl_ms);
                    return Some(lease);
                }
                Ok(_) => return None,
                Err(_) => sleep_ms(BACKOFF_MS).await,
            }
        }
        None
    }

    /// Acquire the lock for `(lease, req)`, waiting in the queue; re-ask with the
    /// same request id whenever no outcome came in time (a lost push, a stalled
    /// connection). `None` when not granted or the lease was lost.
    async fn acquire(&mut self, lease: LeaseId, req: RequestId) -> Option<Grant> {
        let cmd = Command::Acquire(Acquire {
            req,
            lease,
            lock: LOCK.to_string(),
            wait_ms: self.cfg.acquire_wait_ms(),
            lock_delay_ms: 0,
            identity: String::new(),
            value: Vec::new(),
            mode: fencelock_core::Mode::Exclusive,
            weight: 1,
            permits: 0,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: Vec::new(),
        });
        while self.session.borrow().is_live(lease) {
            match self.server.call(cmd.clone()).await {
                Ok(Reply::Acquired(grant)) => return Some(grant),
                Ok(Reply::Queued { .. }) => match self.wait_push(lease, req).await {
                    Some(PushOutcome::Granted(grant)) => return Some(grant),
                    Some(PushOutcome::Ended(_)) => return None,
                    None => {}
                },
                Ok(Reply::Rejected(EngineError::LeaseNotFound(_))) => {
                    self.session.borrow_mut().lose(lease);
                    return None;
                }
                Ok(_) => return None,
                Err(_) => sleep_ms(BACKOFF_MS).await,
            }
        }
        None
    }

    async fn wait_push(&mut self, lease: LeaseId, req: RequestId) -> Option<PushOutcome> {
        let poll_ms = self.cfg.keepalive_every_ms();
        self.server.push_for(lease, req, poll_ms).await.ok().flatten()
    }

    /// Hold the grant: work, check the deadline, (maybe be paused), write, release.
    async fn hold(&mut self, lease: LeaseId, grant: Grant) {
        let token = grant.token;
        let client = self.client();
        let Some(deadline) = self.session.borrow().live_deadline(lease) else {
            return; // granted too late to use: the lease is already lost here
        };
        self.events.push(EventKind::Hold { client, lease, token, deadline });
        sleep_ms(self.rng.u64(0..=THINK_MAX_MS)).await;
        if !self.session.borrow().is_live(lease) {
            return self.end_hold(lease, token);
        }
        let after_pause = self.maybe_pause(token).await;
        self.write(token, after_pause).await;
        self.end_hold(lease, token);
        self.release(lease, token).await;
    }

    /// Record the end of the belief in `token`: now, or when the deadline passed.
    fn end_hold(&self, lease: LeaseId, token: Token) {
        let session = self.session.borrow();
        let at = session.belief_end(lease);
        let why = if session.is_live(lease) { HoldEnd::Released } else { HoldEnd::DeadlinePassed };
        let client = session.client;
        self.events.push_at(at, EventKind::HoldEnd { client, token, why });
    }

    /// If the nemesis armed a pause, take it: stop everything for its duration.
    async fn maybe_pause(&mut self, token: Token) -> bool {
        let client = self.client();
        let Some(ms) = self.pause.take(client) else {
            return false;
        };
        let until = now_ms() + ms;
        self.session.borrow_mut().pause_until(until);
        self.events.push(EventKind::Paused { client, token, until });
        sleep_until_ms(until).await;
        true
    }

    /// One write with the token; a timeout leaves its outcome unknown (the
    /// resource's own record is what the checkers read).
    async fn write(&mut self, token: Token, after_pause: bool) {
        let client = self.client();
        self.events.push(EventKind::WriteSent { client, token, after_pause });
        let _ = self.resource.write(&WriteReq { client, token, after_pause }).await;
    }

    /// Release, retrying the same request id while the lease is live.
    async fn release(&mut self, lease: LeaseId, token: Token) {
        let req = self.session.borrow_mut().req();
        let lock = LOCK.to_string();
        while self.session.borrow().is_live(lease) {
            let cmd = Command::Release { req, lease, lock: lock.clone(), token };
            match self.server.call(cmd).await {
                Ok(_) => return,
                Err(_) => sleep_ms(BACKOFF_MS).await,
            }
        }
    }
}
