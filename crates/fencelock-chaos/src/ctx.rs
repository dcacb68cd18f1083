//! The context a run's nemesis works in ([`Ctx`]: the target, the workers
//! and their proxies, the seeded rng, the harness history) and the notes
//! every fault writes into that history ([`fault`], [`evidence`]).
//!
//! Where it sits: `run` builds the context and lends it to the nemesis
//! (`nemesis`, `cluster_faults`, `peer_input`, `peer_tls`); it depends on
//! none of them, only on what a run is made of (targets, processes, workers,
//! observers, history).

use std::time::Duration;

use fencelock_testkit::proxy::Proxy;

use crate::history::{Event, Op, Writer};
use crate::observers::{HolderPolls, Observers};
use crate::procs::ServerProc;
use crate::scenario::RunSpec;
use crate::secure::Secure;
use crate::targets::Target;
use crate::worker_control::Workers;

/// Everything a nemesis works with: built by `run`, lent to the nemesis.
pub struct Ctx {
    pub spec: RunSpec,
    pub rng: fastrand::Rng,
    pub ttl: Duration,
    pub target: Target,
    /// The storage server's process: alive as long as the run.
    #[allow(dead_code)]
    pub storage: ServerProc,
    pub storage_addr: std::net::SocketAddr,
    pub workers: Workers,
    /// Election mode: the observers of the election.
    pub observers: Option<Observers>,
    /// Shared mode against fencelock's own server: the holder observer.
    pub holder_polls: Option<HolderPolls>,
    /// Per worker: its proxy to the lock service (if the service has one address).
    pub lock_proxies: Vec<Proxy>,
    /// Per worker: its proxy to the storage.
    pub storage_proxies: Vec<Proxy>,
    pub notes: Writer,
    pub data: tempfile::TempDir,
    /// The service's TLS files and tokens, if it runs with TLS and auth.
    pub secure: Option<Secure>,
    /// When the nemesis stops injecting.
    pub end: tokio::time::Instant,
}

impl Ctx {
    pub fn note(&mut self, e: Event) {
        if let Err(err) = self.notes.write(&e) {
            tracing::error!(error = %err, "cannot write the harness history");
        }
    }

    pub fn over(&self) -> bool {
        tokio::time::Instant::now() >= self.end
    }

    /// The URL of the lock service (or of a proxy `via` in front of it), over
    /// TLS with the workers' token if the service runs with TLS and auth.
    pub fn lock_url(&self, via: Option<std::net::SocketAddr>) -> String {
        lock_url(&self.target, self.secure.as_ref(), via)
    }

    /// A seeded duration between `lo` and `hi` times `unit`.
    pub fn between(&mut self, unit: Duration, lo: f64, hi: f64) -> Duration {
        unit.mul_f64(lo + (hi - lo) * self.rng.f64())
    }
}

/// The URL of the lock service, or of a proxy `via` in front of it: over TLS
/// with the workers' token if the service runs with TLS and auth.
pub fn lock_url(target: &Target, secure: Option<&Secure>, via: Option<std::net::SocketAddr>) -> String {
    match (secure, target) {
        (Some(s), Target::Native { grpc, .. }) => s.url(&[via.unwrap_or(*grpc)]),
        (Some(s), Target::Cluster(c)) => s.url(&c.grpc()),
        (_, _) => via.map_or_else(|| target.url(), |p| target.url_via(p)),
    }
}

/// Notes a fault's start or end (`phase`) on `target` in the harness history.
pub fn fault(ctx: &mut Ctx, phase: &str, target: &str, detail: serde_json::Value) {
    let e = Event {
        fault: Some(ctx.spec.scenario.to_string()),
        phase: Some(phase.into()),
        target: Some(target.into()),
        detail,
        ..Event::note("nemesis", Op::Fault)
    };
    ctx.note(e);
}

/// Notes what the nemesis saw (`what`, `count` times, on `target`) in the harness history.
pub fn evidence(ctx: &mut Ctx, what: &str, count: u64, target: &str, detail: serde_json::Value) {
    let e = Event {
        what: Some(what.into()),
        count: Some(count),
        target: Some(target.into()),
        detail,
        ..Event::note("nemesis", Op::Evidence)
    };
    ctx.note(e);
}

/// Waits a seeded `lo_ms`–`hi_ms` between two faults, or until the run's end.
pub async fn pause_between_faults(ctx: &mut Ctx, lo_ms: u64, hi_ms: u64) {
    let ms = ctx.rng.u64(lo_ms..=hi_ms);
    let until = (tokio::time::Instant::now() + Duration::from_millis(ms)).min(ctx.end);
    tokio::time::sleep_until(until).await;
}
