//! The run's history: every event that matters to a checker, stamped with virtual
//! time, in the order it happened. Rendered line by line it is the trace; the same
//! seed must give the same trace, byte for byte.

use std::{cell::RefCell, fmt, rc::Rc};

use fencelock_core::{LeaseId, Millis, ReleaseCause, RequestId, Token};

use crate::wire::Act;

/// One thing that happened, at `at_ms` of virtual time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at_ms: Millis,
    pub kind: EventKind,
}

/// Why a client stopped believing it holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// It sent its release.
    Released,
    /// Its conservative lease deadline passed (at the event's instant).
    DeadlinePassed,
}

/// What a client believes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The lock [`crate::config::LOCK`], exclusively (a writer).
    Exclusive,
    /// The lock [`crate::config::LOCK`], shared (a reader).
    Shared,
    /// This many permits of [`crate::config::SEMAPHORE`].
    Permits(u32),
    /// The lock [`crate::config::MULTI_LOCKS`]`[i]`, exclusively, from a
    /// multi-acquire.
    Part(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The nemesis started a fault.
    FaultStart { fault: String },
    /// The nemesis ended a fault (repair, release, restart, resume).
    FaultEnd { fault: String },
    /// The server (re)started: it replayed `replayed` durable entries and wrote
    /// `LeaderStart`; it serves from now on.
    ServerUp { replayed: usize },
    /// The engine granted the lock (a live `Effect::Granted`, after persistence).
    Granted { lease: LeaseId, req: RequestId, token: Token, queued: bool },
    /// The engine ended a grant.
    Released { lease: LeaseId, token: Token, cause: ReleaseCause },
    /// The engine expired a lease.
    LeaseExpired { lease: LeaseId },
    /// A client got a lease; its conservative deadline is `deadline`.
    ClientLease { client: usize, lease: LeaseId, deadline: Millis },
    /// A client gave its lease up as lost (its deadline passed, or the server
    /// said it is gone).
    ClientLeaseLost { client: usize, lease: LeaseId },
    /// A client learned of its grant and believes it holds the lock from now on,
    /// until its deadline (`deadline` is the deadline it knows now).
    Hold { client: usize, lease: LeaseId, token: Token, deadline: Millis, held: Held },
    /// A client learned of the grant of its multi-acquire `req` on the
    /// locks `locks` ([`crate::config::MULTI_LOCKS`] indexes, in the order
    /// asked) and got `tokens`; a `Hold` per token follows at once.
    HoldAll { client: usize, lease: LeaseId, req: RequestId, locks: Vec<u8>, tokens: Vec<Token> },
    /// A writer stops believing it holds [`Held::Exclusive`] and believes it
    /// holds [`Held::Shared`] with the same token from now on: it is about to
    /// send its downgrade (it writes no more from here).
    Downgrading { client: usize, token: Token },
    /// A client stopped believing it holds `token`; the event's instant is the end
    /// of its belief (its deadline, when that passed first).
    HoldEnd { client: usize, token: Token, why: HoldEnd },
    /// A client was paused between its last deadline check and its act.
    Paused { client: usize, token: Token, until: Millis },
    /// A client sent an act (a read, a write, a permit use) to the resource.
    ActSent { client: usize, token: Token, act: Act, after_pause: bool },
    /// The resource decided an act.
    Acted { client: usize, token: Token, act: Act, accepted: bool, after_pause: bool },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>7} ", self.at_ms)?;
        match &self.kind {
            EventKind::FaultStart { fault } => write!(f, "nemesis  start {fault}"),
            EventKind::FaultEnd { fault } => write!(f, "nemesis  end   {fault}"),
            EventKind::ServerUp { replayed } => {
                write!(f, "server   up (replayed {replayed} entries)")
            }
            EventKind::Granted { lease, req, token, queued } => {
                write!(f, "server   granted token {token} to lease {lease} (req {}, queued {queued})", req.0)
            }
            EventKind::Released { lease, token, cause } => {
                write!(f, "server   ended token {token} of lease {lease} ({cause:?})")
            }
            EventKind::LeaseExpired { lease } => write!(f, "server   lease {lease} expired"),
            other => client_event(f, other),
        }
    }
}

fn client_event(f: &mut fmt::Formatter<'_>, kind: &EventKind) -> fmt::Result {
    match kind {
        EventKind::ClientLease { client, lease, deadline } => {
            write!(f, "client-{client} lease {lease} (deadline {deadline})")
        }
        EventKind::ClientLeaseLost { client, lease } => {
            write!(f, "client-{client} lost lease {lease}")
        }
        EventKind::Hold { client, lease, token, deadline, held } => {
            write!(f, "client-{client} holds token {token} of lease {lease} {held:?} (deadline {deadline})")
        }
        EventKind::HoldAll { client, lease, req, locks, tokens } => {
            write!(f, "client-{client} holds all of {locks:?} with tokens {tokens:?} (lease {lease}, req {})", req.0)
        }
        EventKind::Downgrading { client, token } => write!(f, "client-{client} downgrades token {token}"),
        EventKind::HoldEnd { client, token, why } => {
            write!(f, "client-{client} stops holding token {token} ({why:?})")
        }
        EventKind::Paused { client, token, until } => {
            write!(f, "client-{client} paused holding token {token} until {until}")
        }
        EventKind::ActSent { client, token, act, after_pause } => {
            write!(f, "client-{client} {act:?} with token {token} (after pause {after_pause})")
        }
        EventKind::Acted { client, token, act, accepted, after_pause } => {
            let verdict = if *accepted { "accepted" } else { "REJECTED" };
            write!(f, "resource {verdict} {act:?} of client-{client} token {token} (after pause {after_pause})")
        }
        _ => Ok(()),
    }
}

/// The shared, append-only event log of one run. Every host of the simulation
/// runs on the same thread, so a `RefCell` is enough.
#[derive(Debug, Clone, Default)]
pub struct Events(Rc<RefCell<Vec<Event>>>);

impl Events {
    /// Record `kind` at `at_ms`.
    pub fn push_at(&self, at_ms: Millis, kind: EventKind) {
        self.0.borrow_mut().push(Event { at_ms, kind });
    }

    /// Record `kind` now (inside a simulated host).
    pub fn push(&self, kind: EventKind) {
        self.push_at(crate::clock::now_ms(), kind);
    }

    /// Everything recorded so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.0.borrow().clone()
    }
}
