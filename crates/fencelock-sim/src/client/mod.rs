//! A "client-N" host: one lease kept alive every TTL/3 by its own task and
//! connection, and a worker that acquires the lock, writes to the resource with
//! its token and releases (see [`worker`]).
//!
//! A client can be paused by the nemesis ([`PauseCtl`]): the worker takes an armed
//! pause between its last deadline check and its write; while paused, neither the
//! worker nor the keep-alive does anything.

mod conn;
mod session;
mod worker;

use std::{cell::RefCell, rc::Rc};

use fencelock_core::Millis;

use crate::{
    config::{SimConfig, RESOURCE_PORT, SERVER_PORT},
    event::Events,
};
use conn::{Link, ResourceConn, ServerConn};
use session::Session;
use worker::{Worker, BACKOFF_MS};

/// A pause armed by the nemesis, taken by the first client that reaches its write.
#[derive(Debug, Clone, Default)]
pub struct PauseCtl(Rc<RefCell<PauseState>>);

#[derive(Debug, Default)]
struct PauseState {
    /// A pause of this many milliseconds waits for a taker.
    armed: Option<u64>,
    /// The last pause taken: (client, until).
    taken: Option<(usize, Millis)>,
}

impl PauseCtl {
    pub fn arm(&self, ms: u64) {
        let mut s = self.0.borrow_mut();
        s.armed = Some(ms);
        s.taken = None;
    }

    pub fn disarm(&self) {
        self.0.borrow_mut().armed = None;
    }

    /// Take the armed pause, if there is one (called by a client about to write).
    pub fn take(&self, client: usize) -> Option<u64> {
        let mut s = self.0.borrow_mut();
        let ms = s.armed.take()?;
        s.taken = Some((client, crate::clock::now_ms() + ms));
        Some(ms)
    }

    /// Who took the last pause, and until when.
    pub fn taken(&self) -> Option<(usize, Millis)> {
        self.0.borrow().taken
    }
}

/// What a client host is given.
#[derive(Debug, Clone)]
pub struct ClientShared {
    pub client: usize,
    pub cfg: SimConfig,
    pub events: Events,
    pub pause: PauseCtl,
}

/// The host name of client `i`.
pub fn host_name(i: usize) -> String {
    format!("client-{i}")
}

/// The client host's software.
pub async fn run(shared: ClientShared) -> turmoil::Result {
    let ClientShared { client, cfg, events, pause } = shared;
    let session = Rc::new(RefCell::new(Session::new(client, events.clone())));
    let timeout = cfg.request_timeout_ms();
    let server = || ServerConn::new(Link::new("server", SERVER_PORT, timeout));
    let every = cfg.keepalive_every_ms();
    tokio::task::spawn_local(session::keepalive(session.clone(), server(), every, BACKOFF_MS));
    let seed = cfg.seed ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(client as u64 + 1));
    let worker = Worker {
        session,
        server: server(),
        resource: ResourceConn::new(Link::new("resource", RESOURCE_PORT, timeout)),
        rng: fastrand::Rng::with_seed(seed),
        cfg,
        pause,
        events,
    };
    worker.run().await;
    Ok(())
}
