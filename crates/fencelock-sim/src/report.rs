//! What one run leaves behind for the checkers: its configuration, its events,
//! the durable log (and the engine's outputs when that log is replayed), and the
//! faults that happened.

use fencelock_core::{Engine, Input, Millis, Output};

use crate::{config::SimConfig, event::Event, nemesis::FaultWindow};

#[derive(Debug, Clone)]
pub struct Report {
    pub config: SimConfig,
    /// Every event, in the order it was recorded.
    pub events: Vec<Event>,
    /// The durable log at the end of the run.
    pub log: Vec<Input>,
    /// `log` replayed into a fresh engine: one output per entry.
    pub replayed: Vec<Output>,
    pub faults: Vec<FaultWindow>,
    /// Set when the simulation itself failed (a host returned an error).
    pub error: Option<String>,
}

impl Report {
    pub fn new(
        config: SimConfig,
        events: Vec<Event>,
        log: Vec<Input>,
        faults: Vec<FaultWindow>,
        error: Option<String>,
    ) -> Self {
        let mut engine = Engine::new();
        let replayed = log.iter().map(|input| engine.step(input)).collect();
        Self { config, events, log, replayed, faults, error }
    }

    /// The trace: one line per event, then the error if there was one.
    pub fn trace(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.events.iter().map(|e| e.to_string()).collect();
        if let Some(e) = &self.error {
            lines.push(format!("simulation error: {e}"));
        }
        lines
    }

    /// The virtual instant the run ended.
    pub fn end_ms(&self) -> Millis {
        self.config.duration_ms
    }
}
