//! W1 (uncontended cycles), W2 (contended handoff) and W5 (shared and counted
//! locks): clients that loop acquire → release through the client library,
//! timed in this process.
//!
//! Where it sits: `main` calls [`run`] once per (cell, engine, run), engines
//! interleaved. A client's connection is a [`Locker`]: `fencelock::connect`
//! (or a Redis connection for the seeds' recipe, `engines::SETNX`). Per process (the
//! default) every client connects on its own: `fencelock::connect` opens a
//! new connection each call (a native `Client` dials its own HTTP/2
//! channel; Redis, etcd and PostgreSQL backends their own sockets; ZooKeeper
//! its own sessions), as separate processes would. Shared (an engine
//! `ID/shared`) one `Locker` serves every client's task. Either way the loop is
//! the same: client `i` uses `lockers[i % lockers.len()]`. A run has a warm-up, then a measured window; only grants whose
//! acquire returned inside the window count. The engine's CPU (every process
//! of it: the three nodes of `fencelock-3`) is read at both ends of the window.
//!
//! W2 figures come from one timeline (one monotonic clock, one process): the
//! grants sorted by when their acquire returned. A handoff is the time from a
//! holder starting its release to the next grant's acquire returning. A
//! self re-grant is a grant to the client that held the lock just before; it
//! breaks the FIFO promise when another client's acquire had started before
//! that release began.
//!
//! W5 has two cells. `W5-rw`: every cycle picks one of [`W5_LOCKS`] read-write
//! locks at random and takes it exclusive with probability
//! [`W5_EXCLUSIVE_SHARE`], shared otherwise. `W5-sem`: every client takes one
//! permit of one semaphore of [`W5_PERMITS`]. A W5 handoff is measured per lock:
//! for a grant whose acquire started before the latest release of that lock
//! that began before the grant, the time from that release's start to the
//! grant (a reader granted beside other readers waited for nobody and has no
//! handoff). On one exclusive lock this is W2's handoff.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context};
use fencelock::{Backend, LockOptions, Outcome};
use tokio::time::Instant;

use crate::{engines::Engine, model::RunResult, procstat, profile, stats};

/// W5-rw: the read-write locks the clients share.
pub const W5_LOCKS: usize = 4;
/// W5-rw: the share of acquires that are exclusive (writers).
pub const W5_EXCLUSIVE_SHARE: f64 = 0.1;
/// W5-sem: the semaphore's permits.
pub const W5_PERMITS: u32 = 4;

/// W1: each client on its own lock. W2: every client on one lock, hold 0.
/// W5: a read-mostly mix on [`W5_LOCKS`] read-write locks, and a semaphore of
/// [`W5_PERMITS`]; hold 0 in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Uncontended,
    Contended,
    ReadMostly,
    Semaphore,
}

impl Workload {
    pub fn id(self) -> &'static str {
        match self {
            Workload::Uncontended => "W1",
            Workload::Contended => "W2",
            Workload::ReadMostly => "W5-rw",
            Workload::Semaphore => "W5-sem",
        }
    }

    /// Distinct locks the clients of a cell use.
    pub fn locks(self, clients: usize) -> usize {
        match self {
            Workload::Uncontended => clients,
            Workload::Contended | Workload::Semaphore => 1,
            Workload::ReadMostly => W5_LOCKS,
        }
    }

    /// Whether an engine whose backend declares `caps` can run this cell.
    pub fn runs_on(self, caps: &fencelock::Capabilities) -> bool {
        match self {
            Workload::Uncontended | Workload::Contended => true,
            Workload::ReadMostly => caps.shared,
            Workload::Semaphore => caps.semaphores,
        }
    }

    /// The lock name and options of one cycle of `client`: W5-rw draws the
    /// lock and the mode at random.
    fn cycle_args(self, run_no: usize, client: usize, base: &LockOptions) -> (String, LockOptions) {
        match self {
            Workload::Uncontended => (format!("bench/w1/r{run_no}/c{client}"), base.clone()),
            Workload::Contended => (format!("bench/w2/r{run_no}"), base.clone()),
            Workload::Semaphore => (format!("bench/w5s/r{run_no}"), base.clone().permits(W5_PERMITS)),
            Workload::ReadMostly => {
                let lock = fastrand::usize(..W5_LOCKS);
                let opts = match fastrand::f64() < W5_EXCLUSIVE_SHARE {
                    true => base.clone(),
                    false => base.clone().shared(),
                };
                (format!("bench/w5rw/r{run_no}/l{lock}"), opts)
            }
        }
    }
}

/// How long and with what lease a run goes.
#[derive(Debug, Clone, Copy)]
pub struct RunSpec {
    pub workload: Workload,
    pub clients: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub ttl: Duration,
    /// Distinguishes lock names between runs (a run never sees an earlier run's locks).
    pub run_no: usize,
}

/// One grant as a client saw it.
#[derive(Debug, Clone, Copy)]
struct Grant {
    client: usize,
    /// The lock's name, hashed (W5-rw spreads a client's cycles over locks).
    lock: u64,
    invoked: Instant,
    granted: Instant,
    release_started: Instant,
}

/// A client's lock connection: a backend, or the seeds' Redis recipe.
enum Locker {
    Backend(Backend),
    SetNx(setnx::RedisSetNx),
}

impl Locker {
    async fn connect(engine: &Engine) -> anyhow::Result<Locker> {
        Ok(if crate::engines::is_setnx(&engine.info.id) {
            Locker::SetNx(setnx::RedisSetNx::connect(&engine.url).await?)
        } else {
            Locker::Backend(
                fencelock::connect(&engine.url).await.with_context(|| format!("connect to {}", engine.url))?,
            )
        })
    }

    /// Acquire `name`, release it; returns (granted, release started) or None
    /// if the wait ran out.
    async fn cycle(&self, name: &str, opts: &LockOptions) -> anyhow::Result<Option<(Instant, Instant)>> {
        match self {
            Locker::Backend(b) => match b.acquire(name, opts).await? {
                Outcome::Acquired(g) => {
                    let granted = Instant::now();
                    let release_started = Instant::now();
                    if !g.release().await? {
                        bail!("release of {name} found the grant gone");
                    }
                    Ok(Some((granted, release_started)))
                }
                Outcome::TimedOut | Outcome::Busy { .. } => Ok(None),
            },
            Locker::SetNx(p) => {
                let Some((value, _token)) = p.acquire(name, opts.ttl, opts.wait).await? else { return Ok(None) };
                let granted = Instant::now();
                let release_started = Instant::now();
                if !p.release(name, &value).await? {
                    bail!("release of {name} found the key gone");
                }
                Ok(Some((granted, release_started)))
            }
        }
    }
}

/// How much longer a measured window that saw no grant goes on.
const STALL_BOUND: Duration = Duration::from_secs(10);

/// One measured run of one cell on one engine; with `profile`, the engine's
/// (first) process is sampled by perf for the measured window.
pub async fn run(engine: &Engine, spec: RunSpec, profile: Option<&profile::Target>) -> anyhow::Result<RunResult> {
    let lockers = lockers(engine, spec.clients).await?;
    let opts = LockOptions::default().ttl(spec.ttl).wait(match spec.workload {
        Workload::Uncontended => Duration::ZERO,
        Workload::Contended | Workload::ReadMostly | Workload::Semaphore => Duration::from_secs(30),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    // Grants inside the measured window, counted as they come.
    let measured = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut window = (start + spec.warmup, start + spec.warmup + spec.measure);
    let mut tasks = Vec::new();
    for client in 0..spec.clients {
        let locker = lockers[client % lockers.len()].clone();
        let (stop, errors, base, measured, from) =
            (stop.clone(), errors.clone(), opts.clone(), measured.clone(), window.0);
        tasks.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (name, opts) = spec.workload.cycle_args(spec.run_no, client, &base);
                let lock = hash(&name);
                let invoked = Instant::now();
                match locker.cycle(&name, &opts).await {
                    Ok(Some((granted, release_started))) => {
                        if granted >= from {
                            measured.fetch_add(1, Ordering::Relaxed);
                        }
                        grants.push(Grant { client, lock, invoked, granted, release_started })
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("bench: {name}: {e:#}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            grants
        }));
    }
    tokio::time::sleep_until(window.0).await;
    let recording = match (profile, engine.pids.first()) {
        (Some(target), Some(&pid)) => Some(target.start(pid)?),
        (Some(_), None) => bail!("{}: no server process to profile (given by URL?)", engine.info.id),
        (None, _) => None,
    };
    let me = std::process::id();
    let (cpu_before, own_before) = (engine.cpu_time(), procstat::own_cpu_time(me));
    tokio::time::sleep_until(window.1).await;
    // A window without a single grant measures nothing (an engine stalled,
    // e.g. on an fsync behind a loaded disk): it goes on until the first
    // grant, for at most `STALL_BOUND` more, and reports the time it took.
    if measured.load(Ordering::Relaxed) == 0 {
        while measured.load(Ordering::Relaxed) == 0 && Instant::now() < window.1 + STALL_BOUND {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        window.1 = Instant::now().min(window.1 + STALL_BOUND);
    }
    let (cpu_after, own_after) = (engine.cpu_time(), procstat::own_cpu_time(me));
    if let Some(r) = &recording {
        r.stop()?;
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    // A profile that fails costs the profile, not the run.
    match recording.map(profile::Recording::finish) {
        Some(Ok(svg)) => eprintln!("profile: {}", svg.display()),
        Some(Err(e)) => eprintln!("profile of {} failed: {e:#}", engine.info.id),
        None => {}
    }
    let errors = errors.load(Ordering::Relaxed);
    let mut result = summarize(all, window, cpu_before.zip(cpu_after), spec, errors);
    result.client_cpu_us_per_cycle = own_before
        .zip(own_after)
        .filter(|_| result.cycles > 0)
        .map(|(a, b)| (b - a).as_secs_f64() * 1e6 / result.cycles as f64);
    Ok(result)
}

/// The clients' connections: one of their own each, or one for all of them
/// when the engine is measured shared.
async fn lockers(engine: &Engine, clients: usize) -> anyhow::Result<Vec<Arc<Locker>>> {
    let n = if engine.shared { 1 } else { clients };
    let mut lockers = Vec::with_capacity(n);
    for _ in 0..n {
        lockers.push(Arc::new(Locker::connect(engine).await?));
    }
    Ok(lockers)
}

fn summarize(
    mut grants: Vec<Grant>,
    (from, to): (Instant, Instant),
    cpu: Option<(Duration, Duration)>,
    spec: RunSpec,
    errors: u64,
) -> RunResult {
    grants.retain(|g| g.granted >= from && g.granted < to);
    grants.sort_by_key(|g| g.granted);
    let seconds = (to - from).as_secs_f64();
    let cycles = grants.len() as u64;
    let mut acquire: Vec<f64> = grants.iter().map(|g| ms(g.granted - g.invoked)).collect();
    let mut result = RunResult {
        cycles,
        seconds,
        cycles_per_sec: cycles as f64 / seconds,
        acquire_ms: stats::latency(&mut acquire),
        cpu_us_per_cycle: cpu.filter(|_| cycles > 0).map(|(a, b)| (b - a).as_secs_f64() * 1e6 / cycles as f64),
        errors,
        ..RunResult::default()
    };
    match spec.workload {
        Workload::Contended => contended(&grants, spec.clients, &mut result),
        Workload::ReadMostly | Workload::Semaphore => result.handoff_ms = Some(stats::latency(&mut handoffs(&grants))),
        Workload::Uncontended => {}
    }
    result
}

/// W5 handoffs, over grants sorted by grant time: per lock, a grant whose
/// acquire started before the latest release of that lock that began before
/// the grant waited for that release; its handoff is the time from the
/// release's start to the grant.
fn handoffs(grants: &[Grant]) -> Vec<f64> {
    let mut by_lock: std::collections::HashMap<u64, Vec<&Grant>> = std::collections::HashMap::new();
    for g in grants {
        by_lock.entry(g.lock).or_default().push(g);
    }
    let mut out = Vec::new();
    for lock in by_lock.values() {
        let mut releases: Vec<Instant> = lock.iter().map(|g| g.release_started).collect();
        releases.sort();
        for g in lock {
            let before = releases.partition_point(|&r| r < g.granted);
            let Some(&release) = before.checked_sub(1).and_then(|i| releases.get(i)) else { continue };
            if g.invoked < release {
                out.push(ms(g.granted - release));
            }
        }
    }
    out
}

fn hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

/// Handoff latency, fairness and self re-grants over grants sorted by grant time.
fn contended(grants: &[Grant], clients: usize, r: &mut RunResult) {
    let mut handoff: Vec<f64> =
        grants.windows(2).map(|w| ms(w[1].granted.saturating_duration_since(w[0].release_started))).collect();
    r.handoff_ms = Some(stats::latency(&mut handoff));
    let mut per_client = vec![0u64; clients];
    for g in grants {
        per_client[g.client] += 1;
    }
    let (max, min) = (per_client.iter().copied().max().unwrap_or(0), per_client.iter().copied().min().unwrap_or(0));
    r.fairness = (min > 0).then(|| max as f64 / min as f64);
    r.starved_clients = Some(per_client.iter().filter(|&&n| n == 0).count() as u64);
    // Each client's grants, by index into `grants`, in order.
    let mut by_client: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (i, g) in grants.iter().enumerate() {
        by_client[g.client].push(i);
    }
    let mut selfs = 0u64;
    let mut while_waited = 0u64;
    for i in 0..grants.len().saturating_sub(1) {
        let (prev, next) = (&grants[i], &grants[i + 1]);
        if prev.client != next.client {
            continue;
        }
        selfs += 1;
        let waited = by_client.iter().enumerate().filter(|(c, _)| *c != prev.client).any(|(_, idx)| {
            // The other client's first grant after `i`: was it asked for before the release began?
            let j = idx.partition_point(|&k| k <= i + 1);
            idx.get(j).is_some_and(|&k| grants[k].invoked < prev.release_started)
        });
        if waited {
            while_waited += 1;
        }
    }
    r.self_regrant_share = Some(if grants.len() > 1 { selfs as f64 / (grants.len() - 1) as f64 } else { 0.0 });
    r.self_regrant_while_others_waited = Some(while_waited);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The lock most Redis users write, as the seeds give it: `SET key value NX
/// PX ttl` and, when it is set, `INCR fencing:<key>` for the fencing token,
/// in one script (one round trip); retried every 100 ms while taken
/// (redis-py's `Lock` default `sleep=0.1`); release is a compare-and-delete
/// script. A token per lock, no queue.
mod setnx {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use redis::aio::MultiplexedConnection;
    use tokio::time::Instant;

    /// KEYS: the lock, its token counter; ARGV: the holder's value, the TTL
    /// in ms. The token, or nil when the lock is taken.
    const ACQUIRE: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
                           return redis.call('incr', KEYS[2]) else return false end";
    const RELEASE: &str =
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    const SLEEP: Duration = Duration::from_millis(100);

    pub struct RedisSetNx {
        conn: MultiplexedConnection,
        acquire: redis::Script,
        release: redis::Script,
        next: AtomicU64,
        id: u64,
    }

    impl RedisSetNx {
        pub async fn connect(url: &str) -> anyhow::Result<RedisSetNx> {
            let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
            Ok(RedisSetNx {
                conn,
                acquire: redis::Script::new(ACQUIRE),
                release: redis::Script::new(RELEASE),
                next: AtomicU64::new(0),
                id: fastrand::u64(..),
            })
        }

        /// The value written and the fencing token on success, or None when
        /// `wait` ran out.
        pub async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> anyhow::Result<Option<(String, u64)>> {
            let value = format!("{:x}-{}", self.id, self.next.fetch_add(1, Ordering::Relaxed));
            let end = Instant::now() + wait;
            let mut conn = self.conn.clone();
            let counter = format!("fencing:{key}");
            loop {
                let token: Option<u64> = self
                    .acquire
                    .key(key)
                    .key(&counter)
                    .arg(&value)
                    .arg(ttl.as_millis() as u64)
                    .invoke_async(&mut conn)
                    .await?;
                if let Some(token) = token {
                    return Ok(Some((value, token)));
                }
                if Instant::now() + SLEEP > end {
                    return Ok(None);
                }
                tokio::time::sleep(SLEEP).await;
            }
        }

        pub async fn release(&self, key: &str, value: &str) -> anyhow::Result<bool> {
            let mut conn = self.conn.clone();
            let n: i64 = self.release.key(key).arg(value).invoke_async(&mut conn).await?;
            Ok(n == 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        RunSpec {
            workload: Workload::Contended,
            clients: 3,
            warmup: Duration::ZERO,
            measure: Duration::from_secs(1),
            ttl: Duration::from_secs(1),
            run_no: 0,
        }
    }

    /// Timeline arithmetic: handoffs, fairness, and a self re-grant counted as a
    /// FIFO break only when another client had asked before the release began.
    #[test]
    fn contended_figures() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let g = |client, invoked, granted, release| Grant {
            client,
            lock: 0,
            invoked: at(invoked),
            granted: at(granted),
            release_started: at(release),
        };
        let grants = vec![
            g(0, 0, 1, 2),
            g(0, 3, 4, 5),   // self re-grant; client 1 asked at 1 < 2: a FIFO break
            g(1, 1, 7, 8),   // handoff 5 -> 7
            g(1, 9, 10, 11), // self re-grant; client 2 asks only at 12: no break
            g(2, 12, 13, 14),
        ];
        let r = summarize(grants, (t0, at(100)), None, spec(), 0);
        assert_eq!(r.cycles, 5);
        let h = r.handoff_ms.unwrap();
        assert_eq!(h.samples, 4);
        assert!((h.max - 2.0).abs() < 1e-9, "largest handoff is 2 ms: {h:?}");
        assert_eq!(r.fairness, Some(2.0));
        assert_eq!(r.self_regrant_share, Some(0.5));
        assert_eq!(r.self_regrant_while_others_waited, Some(1));
        assert_eq!(r.starved_clients, Some(0));
    }

    /// Grants outside the measured window do not count; a client with none is starved.
    #[test]
    fn window_and_starvation() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let g = |client, ms| Grant { client, lock: 0, invoked: at(ms), granted: at(ms), release_started: at(ms) };
        let r = summarize(vec![g(0, 5), g(1, 50), g(0, 20), g(0, 30)], (at(10), at(40)), None, spec(), 0);
        assert_eq!(r.cycles, 2);
        assert_eq!(r.fairness, None);
        assert_eq!(r.starved_clients, Some(2));
    }

    /// W5 handoffs: per lock; a grant that asked before the release it
    /// followed waited for it; one that asked later (a reader beside readers,
    /// a new arrival) has no handoff.
    #[test]
    fn w5_handoffs_per_lock() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let g = |client, lock, invoked, granted, release| Grant {
            client,
            lock,
            invoked: at(invoked),
            granted: at(granted),
            release_started: at(release),
        };
        let grants = vec![
            g(0, 1, 0, 1, 10),  // first grant of lock 1: nothing before it
            g(1, 1, 2, 3, 9),   // a reader beside it: no release before its grant
            g(2, 1, 4, 12, 13), // waited: latest release before 12 is 10 -> 2 ms
            g(3, 2, 0, 5, 6),   // lock 2: nothing before it
            g(4, 2, 7, 8, 9),   // asked at 7 after lock 2's release at 6: no wait
            g(5, 2, 1, 15, 16), // waited since 1: latest release before 15 is 9 -> 6 ms
        ];
        let mut h = handoffs(&grants);
        h.sort_by(f64::total_cmp);
        assert_eq!(h, vec![2.0, 6.0]);
    }
}
