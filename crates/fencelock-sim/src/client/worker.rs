//! A client's work loop: get a lease, acquire the lock (waiting in the queue),
//! check the deadline, act at the resource with the token, release.
//!
//! In [`Workload::Mixed`] each round picks a [`Role`]: a reader (shared, reads),
//! a writer (exclusive, writes, and maybe downgrades and reads with the same
//! token) or a permit holder of the semaphore (weight 1 or 2, uses it).
//!
//! The pause happens where Kleppmann put it: after the last deadline check and
//! before the act. The paused client then acts anyway; only the fence can stop
//! that act (a permit holder takes no pause: nothing fences a permit's use).

use fencelock_core::{Acquire, Command, EngineError, Grant, LeaseId, Reply, RequestId, Token};

use super::{
    conn::{ResourceConn, ServerConn},
    session::{gate, SharedSession},
    PauseCtl,
};
use crate::{
    clock::{now_ms, sleep_ms, sleep_until_ms},
    config::{SimConfig, Workload, LOCK, MULTI_LOCKS, PERMITS, SEMAPHORE},
    event::{EventKind, Events, Held, HoldEnd},
    wire::{Act, ActReq, PushOutcome},
};

/// What a client asks for in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Exclusive on [`LOCK`]: write; `downgrade`: then become a reader and read.
    Writer { downgrade: bool },
    /// Shared on [`LOCK`]: read.
    Reader,
    /// `weight` permits of [`SEMAPHORE`]: use them.
    Permits { weight: u32 },
    /// `n` of [`MULTI_LOCKS`] at once, from `first` on (rotating), in reverse
    /// when `reverse`: write each one's register with its token.
    Multi { first: u8, n: u8, reverse: bool },
}

impl Role {
    fn pick(workload: Workload, rng: &mut fastrand::Rng) -> Role {
        if workload == Workload::Exclusive {
            return Role::Writer { downgrade: false };
        }
        match rng.u8(..20) {
            0..7 => Role::Reader,
            7..13 => Role::Writer { downgrade: rng.bool() },
            13..17 => Role::Permits { weight: rng.u32(1..=2) },
            _ => Role::Multi { first: rng.u8(..3), n: rng.u8(2..=3), reverse: rng.bool() },
        }
    }

    /// The locks asked for, as [`MULTI_LOCKS`] indexes (a multi-acquire) or
    /// none (one lock).
    fn parts(self) -> Vec<u8> {
        let Role::Multi { first, n, reverse } = self else {
            return Vec::new();
        };
        let mut parts: Vec<u8> = (0..n).map(|k| (first + k) % MULTI_LOCKS.len() as u8).collect();
        if reverse {
            parts.reverse();
        }
        parts
    }

    /// The lock asked for first (the only one, unless a multi-acquire).
    fn lock(self) -> &'static str {
        match self {
            Role::Permits { .. } => SEMAPHORE,
            Role::Multi { .. } => MULTI_LOCKS[usize::from(self.parts()[0])],
            _ => LOCK,
        }
    }

    /// The acquire's other locks (its `also`).
    fn also(self) -> Vec<String> {
        self.parts().iter().skip(1).map(|&i| MULTI_LOCKS[usize::from(i)].to_string()).collect()
    }

    fn held(self) -> Held {
        match self {
            Role::Writer { .. } | Role::Multi { .. } => Held::Exclusive,
            Role::Reader => Held::Shared,
            Role::Permits { weight } => Held::Permits(weight),
        }
    }

    /// The acquire's mode, weight and permit count.
    fn ask(self) -> (fencelock_core::Mode, u32, u32) {
        match self {
            Role::Writer { .. } | Role::Multi { .. } => (fencelock_core::Mode::Exclusive, 1, 0),
            Role::Reader => (fencelock_core::Mode::Shared, 1, 0),
            Role::Permits { weight } => (fencelock_core::Mode::Exclusive, weight, PERMITS),
        }
    }
}

/// The [`MULTI_LOCKS`] index of `lock`.
fn part_of(lock: &str) -> u8 {
    MULTI_LOCKS.iter().position(|l| *l == lock).expect("a multi-acquire's grant is on one of its locks") as u8
}

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
            let role = Role::pick(self.cfg.workload, &mut self.rng);
            match self.acquire(lease, req, role).await {
                Some(grants) if matches!(role, Role::Multi { .. }) => self.hold_all(lease, req, grants, role).await,
                Some(mut grants) if grants.len() == 1 => self.hold(lease, grants.remove(0), role).await,
                _ => {}
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
    /// connection). `None` when not granted or the lease was lost; the grants
    /// as told (one per lock asked, if the server is right).
    async fn acquire(&mut self, lease: LeaseId, req: RequestId, role: Role) -> Option<Vec<Grant>> {
        let (mode, weight, permits) = role.ask();
        let cmd = Command::Acquire(Acquire {
            req,
            lease,
            lock: role.lock().to_string(),
            wait_ms: self.cfg.acquire_wait_ms(),
            lock_delay_ms: 0,
            identity: String::new(),
            value: Vec::new(),
            mode,
            weight,
            permits,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: role.also(),
        });
        let mut attempt = 0;
        while self.session.borrow().is_live(lease) {
            attempt += 1;
            match self.server.call_attempt(cmd.clone(), attempt).await {
                Ok(Reply::Acquired(grant)) => return Some(vec![grant]),
                Ok(Reply::AcquiredAll(grants)) => return Some(grants),
                Ok(Reply::Queued { .. }) => match self.wait_push(lease, req).await {
                    Some(PushOutcome::Granted(grant)) => return Some(vec![grant]),
                    Some(PushOutcome::GrantedAll(grants)) => return Some(grants),
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

    /// Hold the grant: work, check the deadline, (maybe be paused), act, release.
    async fn hold(&mut self, lease: LeaseId, grant: Grant, role: Role) {
        let token = grant.token;
        let client = self.client();
        let Some(deadline) = self.session.borrow().live_deadline(lease) else {
            return; // granted too late to use: the lease is already lost here
        };
        self.events.push(EventKind::Hold { client, lease, token, deadline, held: role.held() });
        sleep_ms(self.rng.u64(0..=THINK_MAX_MS)).await;
        if !self.session.borrow().is_live(lease) {
            return self.end_hold(lease, token);
        }
        match role {
            Role::Reader => self.act_after_pause(token, Act::Read).await,
            Role::Writer { downgrade } => {
                self.act_after_pause(token, Act::Write).await;
                if downgrade && self.downgrade(lease, token).await {
                    self.act(token, Act::Read, false).await;
                }
            }
            Role::Permits { .. } => self.act(token, Act::Use, false).await,
            Role::Multi { .. } => unreachable!("a multi-acquire is held by hold_all"),
        }
        self.end_hold(lease, token);
        self.release(lease, token, role.lock()).await;
    }

    /// Hold a multi-acquire's grants (INV-18): believe in all of them from
    /// one instant, work, check the deadline, (maybe be paused), write each
    /// lock's register with that lock's token, release each.
    async fn hold_all(&mut self, lease: LeaseId, req: RequestId, grants: Vec<Grant>, role: Role) {
        let client = self.client();
        let Some(deadline) = self.session.borrow().live_deadline(lease) else {
            return;
        };
        let parts: Vec<u8> = grants.iter().map(|g| part_of(g.lock.as_str())).collect();
        let tokens: Vec<Token> = grants.iter().map(|g| g.token).collect();
        self.events.push(EventKind::HoldAll { client, lease, req, locks: role.parts(), tokens: tokens.clone() });
        for (&part, &token) in parts.iter().zip(&tokens) {
            self.events.push(EventKind::Hold { client, lease, token, deadline, held: Held::Part(part) });
        }
        sleep_ms(self.rng.u64(0..=THINK_MAX_MS)).await;
        if self.session.borrow().is_live(lease) {
            let after_pause = self.maybe_pause(tokens[0]).await;
            for (&part, &token) in parts.iter().zip(&tokens) {
                self.act(token, Act::WriteOn(part), after_pause).await;
            }
        }
        for (grant, &token) in grants.iter().zip(&tokens) {
            self.end_hold(lease, token);
            self.release(lease, token, grant.lock.as_str()).await;
        }
    }

    async fn act_after_pause(&mut self, token: Token, act: Act) {
        let after_pause = self.maybe_pause(token).await;
        self.act(token, act, after_pause).await;
    }

    /// Downgrade the write grant to a read grant with the same token (the
    /// belief turns shared before the request leaves). `true` if the server
    /// confirmed it and the lease is still live.
    async fn downgrade(&mut self, lease: LeaseId, token: Token) -> bool {
        if !self.session.borrow().is_live(lease) {
            return false;
        }
        let client = self.client();
        self.events.push(EventKind::Downgrading { client, token });
        let req = self.session.borrow_mut().req();
        let cmd = Command::Downgrade { req, lease, lock: LOCK.to_string(), token };
        let done = matches!(self.server.call(cmd).await, Ok(Reply::Downgraded));
        done && self.session.borrow().is_live(lease)
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

    /// One act with the token; a timeout leaves its outcome unknown (the
    /// resource's own record is what the checkers read).
    async fn act(&mut self, token: Token, act: Act, after_pause: bool) {
        let client = self.client();
        self.events.push(EventKind::ActSent { client, token, act, after_pause });
        let _ = self.resource.act(&ActReq { client, token, act, after_pause }).await;
    }

    /// Release, retrying the same request id while the lease is live.
    async fn release(&mut self, lease: LeaseId, token: Token, lock: &str) {
        let req = self.session.borrow_mut().req();
        let lock = lock.to_string();
        while self.session.borrow().is_live(lease) {
            let cmd = Command::Release { req, lease, lock: lock.clone(), token };
            match self.server.call(cmd).await {
                Ok(_) => return,
                Err(_) => sleep_ms(BACKOFF_MS).await,
            }
        }
    }
}
