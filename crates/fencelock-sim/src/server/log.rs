//! The simulated durable log and the server state that outlives a crash.
//!
//! The log stands in for the Raft log on disk: an entry is durable once it is in
//! the `Vec`, and a crash loses everything else (the engine, the connections, the
//! batch being written). A restart rebuilds the engine by replaying the log.

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
};

use fencelock_core::{Engine, Input};

use crate::{config::Mutant, event::Events};

/// Inputs that reached "disk", in log order.
#[derive(Debug, Clone, Default)]
pub struct DurableLog(Rc<RefCell<Vec<Input>>>);

impl DurableLog {
    pub fn append(&self, input: Input) {
        self.0.borrow_mut().push(input);
    }

    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn entries(&self) -> Vec<Input> {
        self.0.borrow().clone()
    }

    /// A fresh engine with every durable entry applied, in order.
    pub fn replay(&self) -> Engine {
        let mut engine = Engine::new();
        for input in self.0.borrow().iter() {
            engine.step(input);
        }
        engine
    }
}

/// Where the driver is in writing a batch; the nemesis crashes the server inside
/// a write window to hit "around fsync and reply" (scenario K4 of `docs/scenarios.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WritePhase {
    #[default]
    Idle,
    /// The batch is being written: a crash now loses it.
    Syncing,
    /// The batch is durable and applied; replies are on their way: a crash now
    /// loses the replies but not the batch.
    Replying,
}

/// What the server host keeps across crashes, and what the harness watches.
#[derive(Debug, Clone)]
pub struct ServerShared {
    pub log: DurableLog,
    pub events: Events,
    pub mutant: Mutant,
    /// Seeded randomness for disk latency, kept across restarts.
    pub rng: Rc<RefCell<fastrand::Rng>>,
    pub phase: Rc<Cell<WritePhase>>,
    /// Most log writes the driver keeps in flight (see [`crate::SimConfig`]).
    pub max_inflight: usize,
}

impl ServerShared {
    pub fn new(seed: u64, events: Events, mutant: Mutant, max_inflight: usize) -> Self {
        Self {
            log: DurableLog::default(),
            events,
            mutant,
            rng: Rc::new(RefCell::new(fastrand::Rng::with_seed(seed))),
            phase: Rc::default(),
            max_inflight,
        }
    }

    /// Virtual time one write takes (1–3 ms).
    pub fn fsync_ms(&self) -> u64 {
        self.rng.borrow_mut().u64(1..=3)
    }
}
