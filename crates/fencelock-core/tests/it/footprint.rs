//! The engine's memory per idle lease, and the cost of one snapshot of it: a
//! measurement, not a check of a bound (issue 19 §4; numbers belong in the
//! bench and the report: the crate's docs, "Memory per lease", and
//! `docs/guide/performance.md`, "W3's memory, where it goes").
//!
//! Where it sits: beside the model test, through the public API only, with a
//! counting global allocator of its own (this test binary only). It builds
//! W3's state directly in an [`Engine`]: `FOOTPRINT_LEASES` leases (default
//! 100,000) of one hour, granted 4096 commands per batch as the server's log
//! entries carry them, each then taking one lock of its own (`w3/<i>`), and
//! prints the bytes the allocator holds after each phase, the time and memory
//! of the copy a snapshot is built from, and the time and peak
//! memory of serializing the snapshot (JSON, as the server writes it) and of
//! reading it back, with the bytes the engine read back holds (a restart
//! installs such an engine). With `FOOTPRINT_KEEPALIVES=k` each lease is
//! then kept alive `k` times first, as a live lease is (its memory of
//! outcomes grows with them). Lease ids and request ids are random, as the
//! server's API and its clients make them (`Ops::grant_lease` proposes a
//! random 63-bit id): a map keyed by them is filled at random places, not
//! appended to. `FOOTPRINT_IDS=counter` takes the engine's counter and
//! request ids in order instead (the best case, which the server never
//! sees). Run it with
//! `cargo nextest run -p fencelock-core --release footprint:: --run-ignored only --no-capture`.
//!
//! Its checks are the state's (every lease and lock is there; the snapshot
//! reads back to an equal engine), not the numbers.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

use fencelock_core::{Acquire, Command, Engine, Input, LeaseId, Reply, RequestId};

/// The system allocator, counting the bytes it holds and their peak.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Commands per batch, as the server's driver puts at most this many in one log entry.
const BATCH: usize = 4096;
const HOUR_MS: u64 = 3_600_000;

/// `f`'s result and the seconds it took. The one wall-clock read of this file:
/// the time is what is measured here, it never reaches the engine.
#[allow(clippy::disallowed_methods)]
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

fn held() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// Resets the peak to what is held now; the peak from here on, above it.
fn peak_from_here() -> impl FnOnce() -> usize {
    let base = held();
    PEAK.store(base, Ordering::Relaxed);
    move || PEAK.load(Ordering::Relaxed) - base
}

fn step(engine: &mut Engine, now: u64, cmds: Vec<Command>) -> Vec<Reply> {
    engine.step(&Input::Batch { now, cmds }).replies
}

/// How leases and requests get their ids (see the module docs).
#[derive(Clone, Copy, PartialEq)]
enum Ids {
    /// Random, as the server's API proposes lease ids and clients choose request ids.
    Random,
    /// The engine's counter, and request ids in order.
    Counter,
}

impl Ids {
    fn from_env() -> Ids {
        match std::env::var("FOOTPRINT_IDS").as_deref() {
            Ok("counter") => Ids::Counter,
            _ => Ids::Random,
        }
    }
}

/// splitmix64: a fixed sequence of well-spread values, so that runs compare.
fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`th lease's `GrantLease`, its ids made as `ids` says.
fn grant(i: u64, ids: Ids) -> Command {
    match ids {
        Ids::Counter => Command::GrantLease { req: RequestId(i + 1), ttl_ms: HOUR_MS, id: None },
        Ids::Random => Command::GrantLease {
            req: RequestId(spread(2 * i) | 1),
            ttl_ms: HOUR_MS,
            id: Some(LeaseId((spread(2 * i + 1) >> 1).max(1))),
        },
    }
}

/// Grants `n` one-hour leases, [`BATCH`] per step; their ids.
fn grant_all(engine: &mut Engine, n: u64, ids: Ids) -> Vec<LeaseId> {
    let mut leases = Vec::with_capacity(n as usize);
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let cmds = chunk.iter().map(|&i| grant(i, ids));
        for reply in step(engine, 1, cmds.collect()) {
            let Reply::LeaseGranted { lease, .. } = reply else { panic!("grant refused: {reply:?}") };
            leases.push(lease);
        }
    }
    leases
}

/// The `i`th lease takes the lock `w3/<i>` (as W3 names them), [`BATCH`] per step.
fn acquire_all(engine: &mut Engine, leases: &[LeaseId]) {
    for (c, chunk) in leases.chunks(BATCH).enumerate() {
        let first = c * BATCH;
        let cmds = chunk.iter().enumerate().map(|(j, &lease)| {
            Command::Acquire(Acquire::exclusive(RequestId(1), lease, format!("w3/{}", first + j + 1), 0))
        });
        for reply in step(engine, 2, cmds.collect()) {
            assert!(matches!(reply, Reply::Acquired(_)), "every lock is free: {reply:?}");
        }
    }
}

/// Each lease is kept alive `k` times (request ids 2..), [`BATCH`] per step:
/// a live lease's memory of outcomes fills up to `DEDUP_PER_LEASE`.
fn keep_all_alive(engine: &mut Engine, leases: &[LeaseId], reqs: std::ops::Range<u64>) {
    for req in reqs {
        for chunk in leases.chunks(BATCH) {
            let cmds = chunk.iter().map(|&lease| Command::KeepAlive { req: RequestId(req), lease });
            for reply in step(engine, 3, cmds.collect()) {
                assert!(matches!(reply, Reply::LeaseKept { .. }), "every lease lives: {reply:?}");
            }
        }
    }
}

/// Builds W3's state (`n` idle leases, one lock each) and reports where the bytes go.
#[test]
#[ignore = "a measurement: run it in release with --run-ignored only --no-capture"]
fn idle_lease_footprint_and_snapshot_cost() {
    let n: u64 = std::env::var("FOOTPRINT_LEASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let ids = Ids::from_env();
    let mut engine = Engine::new();
    let start = held();

    let (leases, grant_secs) = timed(|| grant_all(&mut engine, n, ids));
    let after_grants = held();

    let ((), acquire_secs) = timed(|| acquire_all(&mut engine, &leases));
    let after_acquires = held();

    let stats = engine.stats();
    assert_eq!((stats.leases, stats.held_locks), (n, n), "every lease holds its lock");

    let per = |bytes: usize| bytes as f64 / n as f64;
    let made = if ids == Ids::Random { "random ids, as the server's" } else { "the counter's ids" };
    println!("engine, {n} idle leases with one lock each, {made} (bytes the allocator holds, per lease):");
    println!("  lease granted (lease, request map, timer): {:8.1}", per(after_grants - start));
    println!("  its lock taken (lock, name, hold, dedup):  {:8.1}", per(after_acquires - after_grants));
    println!("  total:                                     {:8.1}", per(after_acquires - start));
    println!(
        "  grants {grant_secs:.3} s, acquires {acquire_secs:.3} s ({:.0} commands/s)",
        2.0 * n as f64 / (grant_secs + acquire_secs)
    );
    let k: u64 = std::env::var("FOOTPRINT_KEEPALIVES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if k > 0 {
        keep_all_alive(&mut engine, &leases, 2..k + 2);
        println!("  after {k} keep-alives each (remembered):  {:8.1}", per(held() - start));
    }

    // A new leader's first entry re-bases every lease and held lock (INV-8,
    // INV-12); every replica applies it.
    let (out, leader_secs) = timed(|| engine.step(&Input::leader_start(10)));
    assert!(out.effects.is_empty(), "nothing expires at a leader change: {:?}", out.effects);
    println!("a leader change (LeaderStart) over them: {leader_secs:.3} s");

    // The copy a snapshot is built from, taken while applies wait.
    let peak = peak_from_here();
    let (copy, clone_secs) = timed(|| engine.clone());
    println!("copy of the engine (a snapshot's): {clone_secs:.3} s, {:.1} MB", peak() as f64 / 1e6);
    assert!(copy == engine, "the copy equals the engine");
    // While the copy lives (a snapshot being written), a change copies the
    // records and chunks it touches, once: every tenth lease touches every
    // chunk of the lease and timer maps.
    let before = held();
    let tenth: Vec<LeaseId> = leases.iter().step_by(10).copied().collect();
    let ((), kept_secs) = timed(|| keep_all_alive(&mut engine, &tenth, 1_000_000..1_000_001));
    println!(
        "  {} keep-alives (every tenth lease) while it lives: {:.1} MB more, in {kept_secs:.3} s",
        tenth.len(),
        (held() - before) as f64 / 1e6
    );
    assert!(copy != engine, "the copy kept its state");
    drop(copy);

    let peak = peak_from_here();
    let (bytes, ser_secs) = timed(|| serde_json::to_vec(&engine).expect("the engine serializes"));
    let ser_peak = peak();
    println!(
        "snapshot: {} bytes of JSON ({:.1} per lease), serialized in {ser_secs:.3} s, allocation peak {:.1} MB above the state",
        bytes.len(),
        per(bytes.len()),
        ser_peak as f64 / 1e6
    );
    let peak = peak_from_here();
    let before_read = held();
    let (back, de_secs) = timed(|| serde_json::from_slice::<Engine>(&bytes).expect("the snapshot reads back"));
    let read_back = held() - before_read;
    println!(
        "  read back in {de_secs:.3} s, allocation peak {:.1} MB above the state and its bytes",
        peak() as f64 / 1e6
    );
    println!("  the engine read back holds {:8.1} bytes per lease (after a restart)", per(read_back));
    assert!(back == engine, "the snapshot reads back to an equal engine");
}
