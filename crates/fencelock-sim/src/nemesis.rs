//! The nemesis: seeded faults, one episode at a time, applied between simulation
//! steps.
//!
//! Each episode is a fault (a client pause, a server crash and restart, a
//! partition, held messages) followed by a quiet gap longer than the INV-HEAL
//! bound, so that every fault's recovery can be checked on its own. No fault
//! starts in the last part of the run, which is the liveness phase.
//!
//! The first three episodes of every run are fixed in kind (their timing and
//! length are drawn): a pause (Kleppmann's case), a crash-restart (tokens across
//! restarts), all clients but one cut off from the server for longer than a TTL
//! (waiters whose lease ends in the queue), and the clients' messages to and from
//! the server held, then released at once (retries race with what was sent
//! before); the rest are drawn at random.

use std::{cell::Cell, rc::Rc};

use fencelock_core::Millis;
use turmoil::Sim;

use crate::{
    client::{host_name, PauseCtl},
    config::SimConfig,
    event::{EventKind, Events},
    server::WritePhase,
};

/// The kinds of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The next client about to write is paused for 1.5–5 TTLs.
    Pause,
    /// The server crashes inside a write window and restarts later.
    CrashRestart,
    PartitionClientServer,
    PartitionClientResource,
    /// Messages between one client and the server are held, then released.
    HoldClientServer,
    /// Messages between every client and the resource are held (delayed writes).
    HoldWrites,
    /// Messages between every client and the server are held, then released at
    /// once: each client's retries race with what it sent before.
    HoldServer,
    /// The server is cut off from every client.
    IsolateServer,
    /// Every client but one is cut off from the server for longer than a TTL:
    /// the one left keeps taking the lock while the others' queued waits outlive
    /// their leases (scenario S1 of `docs/scenarios.md`, etcd#11456).
    StarveWaiters,
}

const OTHER_KINDS: [FaultKind; 7] = [
    FaultKind::PartitionClientServer,
    FaultKind::PartitionClientResource,
    FaultKind::HoldClientServer,
    FaultKind::HoldWrites,
    FaultKind::HoldServer,
    FaultKind::IsolateServer,
    FaultKind::StarveWaiters,
];

/// One fault as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultWindow {
    pub kind: FaultKind,
    pub what: String,
    pub start: Millis,
    pub end: Millis,
}

/// How to end a fault.
#[derive(Debug, Clone)]
enum Undo {
    Nothing,
    Bounce,
    Repair(Vec<(String, String)>),
    Release(Vec<(String, String)>),
}

#[derive(Debug, Clone)]
struct Active {
    kind: FaultKind,
    what: String,
    start: Millis,
    end_at: Millis,
    undo: Undo,
}

#[derive(Debug, Clone)]
enum State {
    Idle {
        next_at: Millis,
    },
    /// A pause waits for a taker, a crash for a write window.
    Waiting {
        kind: FaultKind,
        ms: u64,
        since: Millis,
    },
    Active(Active),
}

/// The fault schedule of one run.
pub struct Nemesis {
    cfg: SimConfig,
    rng: fastrand::Rng,
    events: Events,
    pause: PauseCtl,
    server_phase: Rc<Cell<WritePhase>>,
    state: State,
    started: usize,
    windows: Vec<FaultWindow>,
}

impl Nemesis {
    pub fn new(cfg: &SimConfig, events: Events, pause: PauseCtl, server_phase: Rc<Cell<WritePhase>>) -> Self {
        Self {
            cfg: cfg.clone(),
            rng: fastrand::Rng::with_seed(cfg.seed ^ 0x6e65_6d65_7369_7321),
            events,
            pause,
            server_phase,
            state: State::Idle { next_at: 2 * cfg.ttl_ms },
            started: 0,
            windows: Vec::new(),
        }
    }

    /// The faults that happened, in order.
    pub fn into_windows(self) -> Vec<FaultWindow> {
        self.windows
    }

    /// Advance the schedule to `now` (called before every simulation step).
    pub fn poll(&mut self, sim: &mut Sim, now: Millis) {
        let state = self.state.clone();
        self.state = match state {
            State::Idle { next_at } if now >= next_at && self.may_start(now) => self.begin(sim, now),
            State::Waiting { kind, ms, since } => self.wait(sim, now, kind, ms, since),
            State::Active(a) if now >= a.end_at => self.end(sim, now, a),
            other => other,
        };
    }

    /// Faults stop early enough that the last one heals before the run ends.
    fn may_start(&self, now: Millis) -> bool {
        let room = 5 * self.cfg.ttl_ms + self.cfg.heal_bound_ms() + 500;
        now + room <= self.cfg.duration_ms
    }

    fn next_kind(&mut self) -> FaultKind {
        self.started += 1;
        match self.started {
            1 => FaultKind::Pause,
            2 => FaultKind::CrashRestart,
            3 => FaultKind::StarveWaiters,
            4 => FaultKind::HoldServer,
            _ => match self.rng.u8(0..7) {
                0..=2 => FaultKind::Pause,
                3 => FaultKind::CrashRestart,
                _ => OTHER_KINDS[self.rng.usize(..OTHER_KINDS.len())],
            },
        }
    }

    fn begin(&mut self, sim: &mut Sim, now: Millis) -> State {
        let kind = self.next_kind();
        let ttl = self.cfg.ttl_ms;
        match kind {
            FaultKind::Pause => {
                let (lo, hi) = self.cfg.pause_range_ms();
                let ms = self.rng.u64(lo..=hi);
                self.pause.arm(ms);
                State::Waiting { kind, ms, since: now }
            }
            FaultKind::CrashRestart => {
                let ms = self.rng.u64(20..=ttl * 3 / 2);
                State::Waiting { kind, ms, since: now }
            }
            _ => self.start_network_fault(sim, now, kind),
        }
    }

    /// A pause starts when a client takes it; a crash waits (briefly) until the
    /// server is inside a write, to hit the windows around fsync and reply.
    fn wait(&mut self, sim: &mut Sim, now: Millis, kind: FaultKind, ms: u64, since: Millis) -> State {
        if kind == FaultKind::Pause {
            if let Some((client, until)) = self.pause.taken() {
                let what = format!("pause of client-{client} for {ms} ms");
                return self.activate(kind, what, until - ms, until, Undo::Nothing);
            }
            if now >= since + 4 * self.cfg.ttl_ms {
                self.pause.disarm();
                return State::Idle { next_at: now };
            }
            return State::Waiting { kind, ms, since };
        }
        let phase = self.server_phase.get();
        if phase == WritePhase::Idle && now < since + 50 {
            return State::Waiting { kind, ms, since };
        }
        sim.crash("server");
        let what = format!("server crash ({phase:?}), restart after {ms} ms");
        self.activate(kind, what, now, now + ms, Undo::Bounce)
    }

    fn start_network_fault(&mut self, sim: &mut Sim, now: Millis, kind: FaultKind) -> State {
        let ttl = self.cfg.ttl_ms;
        let client = host_name(self.rng.usize(..self.cfg.clients.max(1)));
        let all: Vec<String> = (0..self.cfg.clients).map(host_name).collect();
        let others: Vec<String> = all.iter().filter(|c| **c != client).cloned().collect();
        let (pairs, ms, hold) = match kind {
            FaultKind::PartitionClientServer => {
                (pairs(&client, &["server".into()]), self.rng.u64(ttl / 3..=3 * ttl), false)
            }
            FaultKind::PartitionClientResource => {
                (pairs(&client, &["resource".into()]), self.rng.u64(ttl / 3..=3 * ttl), false)
            }
            FaultKind::HoldClientServer => (pairs(&client, &["server".into()]), self.rng.u64(ttl / 3..=2 * ttl), true),
            FaultKind::HoldWrites => (pairs("resource", &all), self.rng.u64(ttl / 2..=2 * ttl), true),
            FaultKind::HoldServer => (pairs("server", &all), self.rng.u64(ttl / 3..=ttl), true),
            FaultKind::StarveWaiters => (pairs("server", &others), self.rng.u64(ttl * 3 / 2..=3 * ttl), false),
            _ => (pairs("server", &all), self.rng.u64(ttl / 2..=2 * ttl), false),
        };
        for (a, b) in &pairs {
            if hold {
                sim.hold(a.as_str(), b.as_str());
            } else {
                sim.partition(a.as_str(), b.as_str());
            }
        }
        let verb = if hold { "hold" } else { "partition" };
        let what = format!("{verb} {} for {ms} ms", describe(&pairs));
        let undo = if hold { Undo::Release(pairs) } else { Undo::Repair(pairs) };
        self.activate(kind, what, now, now + ms, undo)
    }

    fn activate(&mut self, kind: FaultKind, what: String, start: Millis, end_at: Millis, undo: Undo) -> State {
        self.events.push_at(start, EventKind::FaultStart { fault: what.clone() });
        State::Active(Active { kind, what, start, end_at, undo })
    }

    fn end(&mut self, sim: &mut Sim, now: Millis, a: Active) -> State {
        match &a.undo {
            Undo::Nothing => {}
            Undo::Bounce => sim.bounce("server"),
            Undo::Repair(pairs) => pairs.iter().for_each(|(x, y)| sim.repair(x.as_str(), y.as_str())),
            Undo::Release(pairs) => pairs.iter().for_each(|(x, y)| sim.release(x.as_str(), y.as_str())),
        }
        let end = now.max(a.end_at);
        self.events.push_at(end, EventKind::FaultEnd { fault: a.what.clone() });
        self.windows.push(FaultWindow { kind: a.kind, what: a.what, start: a.start, end });
        let gap = self.cfg.heal_bound_ms() + self.rng.u64(100..=self.cfg.ttl_ms);
        State::Idle { next_at: end + gap }
    }
}

fn pairs(a: &str, others: &[String]) -> Vec<(String, String)> {
    others.iter().map(|b| (a.to_string(), b.clone())).collect()
}

fn describe(pairs: &[(String, String)]) -> String {
    let names: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}/{b}")).collect();
    names.join(", ")
}
