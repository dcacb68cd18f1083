//! Builds one seeded turmoil simulation, runs it for its virtual duration with
//! the nemesis acting between steps, and collects the [`Report`].

use std::{
    cell::RefCell,
    rc::Rc,
    time::{Duration, SystemTime},
};

use turmoil::Sim;

use crate::{
    client::{self, ClientShared, PauseCtl},
    config::{SimConfig, MAX_LATENCY_MS, MIN_LATENCY_MS},
    event::Events,
    nemesis::Nemesis,
    report::Report,
    resource::{self, Register, ResourceShared},
    server::{self, ServerShared},
};

/// Run the simulation `cfg` describes. Same config, same report.
pub fn run(cfg: &SimConfig) -> Report {
    let events = Events::default();
    let pause = PauseCtl::default();
    let server = ServerShared::new(cfg.seed ^ 0x7365_7276_6572, events.clone(), cfg.mutant, cfg.max_inflight);
    let mut sim = builder(cfg).build();
    add_hosts(&mut sim, cfg, &server, &events, &pause);
    let mut nemesis = Nemesis::new(cfg, events.clone(), pause, server.phase.clone());
    let error = drive(&mut sim, &mut nemesis, cfg.duration_ms);
    drop(sim);
    let log = server.log.entries();
    Report::new(cfg.clone(), events.snapshot(), log, nemesis.into_windows(), error)
}

fn builder(cfg: &SimConfig) -> turmoil::Builder {
    let mut b = turmoil::Builder::new();
    b.rng_seed(cfg.seed)
        // A fixed epoch: nothing in a run depends on the machine's clock.
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        .simulation_duration(Duration::from_millis(cfg.duration_ms + 60_000))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(MIN_LATENCY_MS))
        .max_message_latency(Duration::from_millis(MAX_LATENCY_MS))
        .tcp_capacity(4096);
    b
}

fn add_hosts(sim: &mut Sim, cfg: &SimConfig, server: &ServerShared, events: &Events, pause: &PauseCtl) {
    let s = server.clone();
    sim.host("server", move || server::run(s.clone()));
    let r = ResourceShared { register: Rc::new(RefCell::new(Register::new(cfg.mutant))), events: events.clone() };
    sim.host("resource", move || resource::run(r.clone()));
    for i in 0..cfg.clients {
        let c = ClientShared { client: i, cfg: cfg.clone(), events: events.clone(), pause: pause.clone() };
        sim.host(client::host_name(i), move || client::run(c.clone()));
    }
}

/// Step until `duration_ms` of virtual time; the error if the simulation failed.
fn drive(sim: &mut Sim, nemesis: &mut Nemesis, duration_ms: u64) -> Option<String> {
    loop {
        let now = u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now >= duration_ms {
            return None;
        }
        nemesis.poll(sim, now);
        if let Err(e) = sim.step() {
            return Some(e.to_string());
        }
    }
}
