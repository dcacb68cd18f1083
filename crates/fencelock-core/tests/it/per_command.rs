//! The engine's time per command on the hot path (issue 19 §4): a
//! measurement, not a check of a bound (numbers belong in the report).
//!
//! Where it sits: beside `footprint.rs`, through the public API only. It
//! grants `PER_COMMAND_LEASES` leases (default 1,000) of one hour, fills each
//! lease's memory of requests with `PER_COMMAND_FILL` keep-alives (default
//! `DEDUP_PER_LEASE`, the worst case for a lookup; 0 with many leases
//! measures the maps instead), then runs `PER_COMMAND_ROUNDS` rounds (default 20) in which
//! every lease takes a lock of its own, releases it and keeps itself alive,
//! each with a new request id, 4096 commands per batch as the server's log
//! entries carry them; it prints the time per command. Run it with
//! `cargo nextest run -p fencelock-core --release per_command:: --run-ignored only --no-capture`.
//!
//! On a shared machine the wall-clock time it prints swings by 2-3x with the
//! other processes' load; the CPU time does not as much: compare
//! `perf stat -e task-clock` of the test binary (`--ignored`) run with
//! `PER_COMMAND_ROUNDS=0` and with `PER_COMMAND_ROUNDS=100` (the difference is
//! the rounds' 3 x leases x 100 commands).
//!
//! Its checks are the replies' (every acquire is granted, every release and
//! keep-alive succeeds), not the time.

use std::time::Instant;

use fencelock_core::{Acquire, Command, Engine, Input, LeaseId, Reply, RequestId, Token, DEDUP_PER_LEASE};

/// Commands per batch, as the server's driver puts at most this many in one log entry.
const BATCH: usize = 4096;
const HOUR_MS: u64 = 3_600_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `f`'s result and the seconds it took. The one wall-clock read of this file:
/// the time is what is measured here, it never reaches the engine.
#[allow(clippy::disallowed_methods)]
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

/// Applies `cmds`, [`BATCH`] per step, at instant `now`; every reply.
fn run(engine: &mut Engine, now: u64, cmds: Vec<Command>) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(cmds.len());
    let mut cmds = cmds.into_iter().peekable();
    while cmds.peek().is_some() {
        let batch = cmds.by_ref().take(BATCH).collect();
        replies.extend(engine.step(&Input::Batch { now, cmds: batch }).replies);
    }
    replies
}

fn keep_alive(lease: LeaseId, req: u64) -> Command {
    Command::KeepAlive { req: RequestId(req), lease }
}

/// The first half of a round for `lease`: acquire `p/<lease>` with request
/// `req`, keep the lease alive with `req + 2` (the release, `req + 1`, needs
/// the acquire's token).
fn round(lease: LeaseId, req: u64) -> [Command; 2] {
    let lock = format!("p/{}", lease.0);
    [Command::Acquire(Acquire::exclusive(RequestId(req), lease, lock, 0)), keep_alive(lease, req + 2)]
}

#[test]
#[ignore = "a measurement: run it in release with --run-ignored only --no-capture"]
fn time_per_command_of_acquire_release_and_keep_alive() {
    let (n, rounds) = (env_or("PER_COMMAND_LEASES", 1_000), env_or("PER_COMMAND_ROUNDS", 20));
    let fill = env_or("PER_COMMAND_FILL", DEDUP_PER_LEASE as u64);
    let mut engine = Engine::new();
    let grants = (0..n).map(|i| Command::GrantLease { req: RequestId(i + 1), ttl_ms: HOUR_MS, id: None });
    let leases: Vec<LeaseId> = (run(&mut engine, 1, grants.collect()).into_iter())
        .map(|r| match r {
            Reply::LeaseGranted { lease, .. } => lease,
            other => panic!("grant refused: {other:?}"),
        })
        .collect();
    let fills = (1..=fill).flat_map(|req| leases.iter().map(move |&l| keep_alive(l, req)));
    let filled = run(&mut engine, 2, fills.collect());
    assert!(filled.iter().all(|r| matches!(r, Reply::LeaseKept { .. })), "every keep-alive succeeds");

    let mut req = 1_000_000;
    let mut seconds = 0.0;
    let mut commands = 0;
    for r in 0..rounds {
        let now = 3 + r;
        let acquires: Vec<Command> = leases.iter().flat_map(|&l| round(l, req)).collect();
        let (replies, t1) = timed(|| run(&mut engine, now, acquires));
        let tokens: Vec<Token> = (replies.iter().step_by(2))
            .map(|r| match r {
                Reply::Acquired(g) => g.token,
                other => panic!("every lock is free: {other:?}"),
            })
            .collect();
        assert!(replies.iter().skip(1).step_by(2).all(|r| matches!(r, Reply::LeaseKept { .. })));
        let releases = leases.iter().zip(&tokens).map(|(&lease, &token)| {
            let lock = format!("p/{}", lease.0);
            Command::Release { req: RequestId(req + 1), lease, lock, token }
        });
        let releases: Vec<Command> = releases.collect();
        let count = 2 * leases.len() + releases.len();
        let (released, t2) = timed(|| run(&mut engine, now, releases));
        assert!(released.iter().all(|r| *r == Reply::Released), "every release succeeds");
        seconds += t1 + t2;
        commands += count;
        req += 3;
    }
    println!(
        "{n} leases, each remembering {} requests at the start: {commands} commands (acquire, release, keep-alive) in {seconds:.3} s: {:.0} ns per command",
        fill.min(DEDUP_PER_LEASE as u64),
        seconds * 1e9 / commands as f64
    );
}
