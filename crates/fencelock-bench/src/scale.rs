//! W3 scale (native server): many live leases, each holding a lock of its own;
//! the server's resident memory per lease, the time to create them, and the
//! server's CPU while some of them renew at TTL/3.
//!
//! Where it sits: `main` calls [`run`] once, on a fresh [`NativeServer`]. The
//! leases are created through [`fencelock::Session`]s (one connection each,
//! many requests in flight on each), by a fixed set of worker tasks that take
//! the next lease number from a shared counter: client memory stays bounded
//! whatever the lease count. `catchup` creates its idle leases with the same
//! code ([`open_sessions`], [`create_idle`]). Idle leases get the longest TTL
//! (1 h) and are never touched again; the renewing ones get a short TTL, are
//! created last, and are renewed from the moment they exist by [`Renewer`],
//! which spreads them over the renewal period in slots of 10 ms. Every keep-alive is a
//! command through the server's Raft log, like a grant.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{bail, Context};
use fencelock::{Client, Error, Outcome, Session};
use tokio::{
    task::JoinSet,
    time::{Instant, MissedTickBehavior},
};

use crate::{
    admin::{http_get_within, wait_ready},
    engines::NativeServer,
    model::Scale,
    procstat,
};

/// Sessions (each on a connection of its own) that create the leases.
pub(crate) const SESSIONS: usize = 16;
/// Creates in flight per session (the server writes at most 4096 commands per log entry).
pub(crate) const WINDOW: usize = 256;
/// TTL of the idle leases: the longest the server allows, so they live through the run unrenewed.
const IDLE_TTL: Duration = Duration::from_secs(3600);
/// TTL of the renewing leases; they renew every TTL/3.
const RENEW_TTL: Duration = Duration::from_secs(3);
/// The renewal period is cut into this many slots; each renewing lease sits in one.
const SLOTS: usize = 100;
/// Deadline of every RPC while creating (a queue of thousands of creates can be slow on a debug build).
const RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a `/metrics` scrape may take (see [`ServerCounters::read`]).
const METRICS_LIMIT: Duration = Duration::from_secs(120);

/// W3: create `leases` leases (the last `renewing` of them with a short TTL,
/// renewed from creation on), each holding one lock; measure memory, creation
/// time, then the server's CPU for `measure` while the renewing ones renew.
pub async fn run(native: &mut NativeServer, leases: u64, renewing: u64, measure: Duration) -> anyhow::Result<Scale> {
    let renewing = renewing.min(leases);
    let http = native.http_addr().to_string();
    let pid = native.pid();
    wait_ready(&http, Duration::from_secs(30)).await?;
    let sessions = open_sessions(&native.url(), SESSIONS).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = procstat::rss_bytes(pid).context("read the server's resident memory")?;
    let at_start = ServerCounters::read(&http).await?;

    let renewer = Arc::new(Renewer::new(sessions.clone()));
    let renewing_task = tokio::spawn(renewer.clone().run());
    let renewing_ones = Some(Renewing { last: renewing, renewer: renewer.clone() });
    let cpu_at_start = CpuSplit::read(pid)?;
    let created = create_leases(&sessions, 0..leases, renewing_ones).await?;
    let create_cpu = CpuSplit::read(pid)?.since(&cpu_at_start).per(leases);
    let create_seconds = created.seconds;
    let after_create = ServerCounters::read(&http).await?;
    let create_failures = created.failures;
    if let Some(e) = created.first_error {
        eprintln!("W3: {create_failures} creates failed; the first: {e}");
    }
    if created.not_asked > 0 {
        bail!("W3 gave up after {GIVE_UP_AFTER} failed creates in a row; {} not asked for", created.not_asked);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after_create = procstat::rss_bytes(pid).context("read the server's resident memory")?;
    let (rss_after, settle_seconds) = settle(pid, rss_after_create).await?;

    // The measurement: only the renewing leases are active.
    let cpu_before = procstat::cpu_time(pid).context("read the server's CPU time")?;
    let acks_before = renewer.acks.load(Ordering::Relaxed);
    let before = ServerCounters::read(&http).await?;
    let from = Instant::now();
    tokio::time::sleep(measure).await;
    let cpu_after = procstat::cpu_time(pid).context("read the server's CPU time")?;
    let renewals = renewer.acks.load(Ordering::Relaxed) - acks_before;
    let renew_seconds = from.elapsed().as_secs_f64();
    let after = ServerCounters::read(&http).await?;
    renewing_task.abort();
    let renew_failures = renewer.failures.load(Ordering::Relaxed);
    if let Some(e) = renewer.first_error.lock().unwrap().take() {
        eprintln!("W3: {renew_failures} keep-alives failed; the first: {e}");
    }

    let cpu = (cpu_after - cpu_before).as_secs_f64();
    let create_entries = after_create.entries - at_start.entries;
    let create_commands = after_create.commands - at_start.commands;
    Ok(Scale {
        leases,
        create_seconds,
        create_seconds_runs: vec![create_seconds],
        creates_per_sec: if create_seconds > 0.0 { leases as f64 / create_seconds } else { 0.0 },
        create_server_cpu_us: create_cpu.server,
        create_client_cpu_us: create_cpu.client,
        rss_before,
        rss_after_create,
        rss_after,
        settle_seconds,
        bytes_per_lease: if leases > 0 { rss_after.saturating_sub(rss_before) as f64 / leases as f64 } else { 0.0 },
        renewing,
        renew_ttl_ms: RENEW_TTL.as_millis() as u64,
        renewals,
        renew_seconds,
        renew_cpu_cores: cpu / renew_seconds,
        cpu_us_per_renewal: if renewals > 0 { cpu * 1e6 / renewals as f64 } else { 0.0 },
        renew_failures,
        create_failures,
        create_sessions: SESSIONS as u64,
        create_in_flight: (SESSIONS * WINDOW) as u64,
        create_log_entries: create_entries,
        create_log_commands: create_commands,
        create_commands_per_entry: ratio(create_commands, create_entries),
        renew_log_entries: after.entries - before.entries,
        renew_log_commands: after.commands - before.commands,
        renew_max_latency_ms: renewer.max_latency_us.load(Ordering::Relaxed) as f64 / 1000.0,
        renewing_lost: renewer.lost.load(Ordering::Relaxed),
        live_leases_end: after.active_leases,
        held_locks_end: after.held_locks,
        lease_expirations: after.expirations,
    })
}

/// CPU seconds (user + system) of the server and of this process, the
/// bench's client side (or, after [`CpuSplit::per`], µs per operation).
struct CpuSplit {
    server: f64,
    client: f64,
}

impl CpuSplit {
    fn read(server_pid: u32) -> anyhow::Result<CpuSplit> {
        let server = procstat::cpu_time(server_pid).context("read the server's CPU time")?;
        let client = procstat::own_cpu_time(std::process::id()).context("read the bench's own CPU time")?;
        Ok(CpuSplit { server: server.as_secs_f64(), client: client.as_secs_f64() })
    }

    fn since(&self, start: &CpuSplit) -> CpuSplit {
        CpuSplit { server: self.server - start.server, client: self.client - start.client }
    }

    /// µs per one of `ops` operations (0 for none).
    fn per(&self, ops: u64) -> CpuSplit {
        let per = |s: f64| if ops > 0 { s * 1e6 / ops as f64 } else { 0.0 };
        CpuSplit { server: per(self.server), client: per(self.client) }
    }
}

/// How often [`settle`] reads the server's resident memory.
const SETTLE_EVERY: Duration = Duration::from_millis(500);
/// The readings that must lie within [`SETTLE_BAND`] for the memory to count
/// as settled: 2 s of them.
const SETTLE_READINGS: usize = 4;
/// How far apart the last [`SETTLE_READINGS`] may lie: 1 MiB.
const SETTLE_BAND: u64 = 1 << 20;
/// The longest [`settle`] waits; it then takes the last reading.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// The server's resident memory once it has stopped falling, and the seconds
/// that took, starting from `first` (read a second after the creates). The
/// allocator returns freed pages to the system a while after they were freed
/// (mimalloc purges after a delay, on its next calls): at 1M leases the
/// server's memory went on falling for about 8 s, by some 70 MB, after the
/// creates (issue 38 §3). An idle lease's cost is what stays.
async fn settle(pid: u32, first: u64) -> anyhow::Result<(u64, f64)> {
    let from = Instant::now();
    let mut readings = vec![first];
    while !settled(&readings) && from.elapsed() < SETTLE_LIMIT {
        tokio::time::sleep(SETTLE_EVERY).await;
        readings.push(procstat::rss_bytes(pid).context("read the server's resident memory")?);
    }
    let last = readings.last().copied().unwrap_or(first);
    Ok((last, from.elapsed().as_secs_f64()))
}

/// Whether the last [`SETTLE_READINGS`] of `readings` lie within [`SETTLE_BAND`].
fn settled(readings: &[u64]) -> bool {
    let Some(last) = readings.len().checked_sub(SETTLE_READINGS).map(|from| &readings[from..]) else {
        return false;
    };
    let (lo, hi) = (last.iter().min(), last.iter().max());
    matches!((lo, hi), (Some(lo), Some(hi)) if hi - lo <= SETTLE_BAND)
}

/// `count` sessions ([`SESSIONS`] in W3) to the server at `url`, each on a
/// connection of its own, with a deadline of [`RPC_TIMEOUT`] per call: what
/// [`create_leases`] creates through, [`WINDOW`] creates in flight on each.
/// A group's leader alone: a session does not follow a leader.
pub(crate) async fn open_sessions(url: &str, count: usize) -> anyhow::Result<Vec<Session>> {
    let mut sessions = Vec::with_capacity(count);
    for _ in 0..count {
        let client = Client::builder(url).rpc_timeout(RPC_TIMEOUT).connect().await?;
        sessions.push(client.session().await.context("open a session")?);
    }
    Ok(sessions)
}

/// The leases that renew: the last `last` created, each handed to `renewer`
/// as soon as it is granted.
struct Renewing {
    last: u64,
    renewer: Arc<Renewer>,
}

/// What [`create_leases`] did.
pub(crate) struct Created {
    /// From the first create sent to the last one acknowledged.
    pub seconds: f64,
    /// Creates that failed (any error), and the first error.
    pub failures: u64,
    pub first_error: Option<String>,
    /// The numbers not asked for: the run gave up after [`GIVE_UP_AFTER`]
    /// failures in a row (the node it goes through no longer leads, say).
    pub not_asked: u64,
}

/// Failures in a row after which [`create_leases`] asks for no more: a node
/// that lost its leadership answers every create at once with "not the
/// leader", and the rest of ten million would go the same way. The caller
/// sees what was made and starts again where the leader is.
const GIVE_UP_AFTER: u64 = 2_000;

/// Creates a lease for each `i` of `numbers`, holding lock `w3/{i}`, through
/// `sessions` with [`WINDOW`] creates in flight on each: worker tasks take the
/// next lease number from a shared counter, so the bench's memory stays
/// bounded whatever the count. Idle leases get [`IDLE_TTL`] and are never
/// touched again; with `renewing`, the last ones get [`RENEW_TTL`] and are
/// renewed from their grant on. W3 and `catchup` (idle only, [`create_idle`])
/// create their leases here.
async fn create_leases(
    sessions: &[Session],
    numbers: std::ops::Range<u64>,
    renewing: Option<Renewing>,
) -> anyhow::Result<Created> {
    let (first, end) = (numbers.start, numbers.end.max(numbers.start));
    let renewing = renewing.map(|r| Arc::new(Renewing { last: r.last.min(end - first), renewer: r.renewer }));
    let next = Arc::new(AtomicU64::new(first));
    let failures = Arc::new(AtomicU64::new(0));
    let (in_a_row, asked) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for session in sessions {
        for _ in 0..WINDOW {
            let (session, next, failures, first_error, renewing) =
                (session.clone(), next.clone(), failures.clone(), first_error.clone(), renewing.clone());
            let (in_a_row, asked) = (in_a_row.clone(), asked.clone());
            workers.spawn(async move {
                let mut last_ack = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return last_ack;
                    }
                    asked.fetch_add(1, Ordering::Relaxed);
                    let renewer = renewing.as_ref().filter(|r| i >= end - r.last).map(|r| &*r.renewer);
                    match create(&session, i, renewer).await {
                        Ok(at) => {
                            last_ack = Some(at);
                            in_a_row.store(0, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            if in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= GIVE_UP_AFTER {
                                next.fetch_max(end, Ordering::Relaxed);
                            }
                            if let Ok(mut first) = first_error.lock() {
                                first.get_or_insert_with(|| format!("lease {i}: {e:#}"));
                            }
                        }
                    }
                }
            });
        }
    }
    let mut last_ack = None;
    while let Some(r) = workers.join_next().await {
        last_ack = last_ack.max(r.context("a lease-creating task")?);
    }
    let first_error = first_error.lock().ok().and_then(|mut e| e.take());
    Ok(Created {
        seconds: last_ack.map_or(0.0, |t: Instant| (t - started).as_secs_f64()),
        failures: failures.load(Ordering::Relaxed),
        first_error,
        not_asked: (end - first).saturating_sub(asked.load(Ordering::Relaxed)),
    })
}

/// [`create_leases`] with every lease idle ([`IDLE_TTL`], never renewed).
pub(crate) async fn create_idle(sessions: &[Session], numbers: std::ops::Range<u64>) -> anyhow::Result<Created> {
    create_leases(sessions, numbers, None).await
}

/// Grants lease `i` and takes its lock; the time the grant was acknowledged.
/// With a `renewer`, the lease has [`RENEW_TTL`] and is renewed from its grant on.
async fn create(session: &Session, i: u64, renewer: Option<&Renewer>) -> anyhow::Result<Instant> {
    let renews = renewer.is_some();
    let lease = session.grant_lease(if renews { RENEW_TTL } else { IDLE_TTL }).await.context("grant_lease")?;
    if let Some(r) = renewer {
        r.add(lease); // renewed from now on, before its lock is even asked for
    }
    match session.acquire(&format!("w3/{i}"), lease, Duration::ZERO, Duration::ZERO).await.context("acquire")? {
        Outcome::Acquired(_) => Ok(Instant::now()),
        other => bail!("lock w3/{i} not granted: {other:?}"),
    }
}

/// Keeps the renewing leases alive: every TTL/3, each lease once, spread evenly
/// over the period (a lease sits in one of [`SLOTS`] slots of TTL/3 ÷ SLOTS).
struct Renewer {
    slots: Vec<Mutex<Vec<u64>>>,
    next_slot: AtomicUsize,
    sessions: Vec<Session>,
    /// Keep-alives acknowledged.
    acks: AtomicU64,
    /// Keep-alives that failed (any error).
    failures: AtomicU64,
    /// Leases a keep-alive found ended (they leave the rotation).
    lost: AtomicU64,
    max_latency_us: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Renewer {
    fn new(sessions: Vec<Session>) -> Renewer {
        Renewer {
            slots: (0..SLOTS).map(|_| Mutex::new(Vec::new())).collect(),
            next_slot: AtomicUsize::new(0),
            sessions,
            acks: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            max_latency_us: AtomicU64::new(0),
            first_error: Mutex::new(None),
        }
    }

    /// Puts `lease` into the next slot, round robin.
    fn add(&self, lease: u64) {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.slots[slot].lock().unwrap().push(lease);
    }

    /// Every TTL/3 ÷ SLOTS, sends a keep-alive for every lease of the next slot.
    async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(RENEW_TTL / 3 / SLOTS as u32);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for k in 0usize.. {
            tick.tick().await;
            let slot = k % SLOTS;
            let leases = self.slots[slot].lock().unwrap().clone();
            for (j, lease) in leases.into_iter().enumerate() {
                let session = self.sessions[(k + j) % self.sessions.len()].clone();
                let me = self.clone();
                tokio::spawn(async move { me.renew(&session, slot, lease).await });
            }
        }
    }

    async fn renew(&self, session: &Session, slot: usize, lease: u64) {
        let sent = Instant::now();
        match session.keep_alive(lease).await {
            Ok(_) => {
                self.acks.fetch_add(1, Ordering::Relaxed);
                self.max_latency_us.fetch_max(sent.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                if matches!(e, Error::LeaseNotFound(_)) {
                    self.lost.fetch_add(1, Ordering::Relaxed);
                    self.slots[slot].lock().unwrap().retain(|&l| l != lease);
                }
                self.first_error.lock().unwrap().get_or_insert_with(|| format!("lease {lease}: {e}"));
            }
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

// ---- the server's admin endpoint ---------------------------------------------------------------------------------

/// Counters and gauges of the server's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ServerCounters {
    /// `fencelock_log_entries_total`: log entries the driver wrote.
    pub entries: u64,
    /// `fencelock_log_commands_total`: commands in those entries.
    pub commands: u64,
    /// `fencelock_active_leases`.
    pub active_leases: u64,
    /// `fencelock_held_locks`.
    pub held_locks: u64,
    /// `fencelock_lease_expirations_total`.
    pub expirations: u64,
}

impl ServerCounters {
    /// Reads them. A scrape renders the per-lock metrics from the whole state
    /// (the stuck holders: every lock), seconds at millions of locks, so it is
    /// given [`METRICS_LIMIT`], and one slower than a second is reported.
    pub async fn read(http_addr: &str) -> anyhow::Result<ServerCounters> {
        let asked = std::time::Instant::now();
        let (status, body) = http_get_within(http_addr, "/metrics", METRICS_LIMIT).await?;
        let took = asked.elapsed();
        if took > Duration::from_secs(1) {
            eprintln!("bench: GET http://{http_addr}/metrics answered after {:.1} s", took.as_secs_f64());
        }
        if status != 200 {
            bail!("GET http://{http_addr}/metrics answered {status}");
        }
        ServerCounters::parse(&body)
    }

    /// From the Prometheus text format.
    fn parse(text: &str) -> anyhow::Result<ServerCounters> {
        let get = |name: &str| {
            fencelock_http::prometheus::value(text, name)
                .with_context(|| format!("metric {name} missing from /metrics"))
        };
        Ok(ServerCounters {
            entries: get("fencelock_log_entries_total")?,
            commands: get("fencelock_log_commands_total")?,
            active_leases: get("fencelock_active_leases")?,
            held_locks: get("fencelock_held_locks")?,
            expirations: get("fencelock_lease_expirations_total")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU per create is what each side used between the two readings,
    /// over the creates; nothing created costs nothing (not a division by 0).
    #[test]
    fn the_cpu_per_create_is_each_sides_use_over_the_creates() {
        let (start, end) = (CpuSplit { server: 10.0, client: 4.0 }, CpuSplit { server: 39.0, client: 14.0 });
        let per = end.since(&start).per(1_000_000);
        assert!((per.server - 29.0).abs() < 1e-9 && (per.client - 10.0).abs() < 1e-9);
        let none = end.since(&start).per(0);
        assert_eq!((none.server, none.client), (0.0, 0.0));
        let me = CpuSplit::read(std::process::id()).expect("this process's CPU");
        assert!(me.server >= me.client, "a process and its children used at least what it did alone");
    }

    /// Rule: the memory counts as settled only once the last 2 s of
    /// readings lie within 1 MiB, not while it still falls, nor before there
    /// are 2 s of readings.
    #[test]
    fn memory_settles_when_it_stops_falling() {
        const MIB: u64 = 1 << 20;
        assert!(!settled(&[]), "no reading");
        assert!(!settled(&[500 * MIB; 3]), "fewer readings than 2 s of them");
        assert!(settled(&[500 * MIB; 4]));
        let falling = [576, 560, 540, 520, 510, 506].map(|m| m * MIB);
        assert!(!settled(&falling), "still falling by MBs a reading");
        let flat = [576, 560, 540, 520, 505, 505, 504, 505].map(|m| m * MIB);
        assert!(settled(&flat), "the last four within 1 MiB");
        assert!(!settled(&[505 * MIB, 505 * MIB, 505 * MIB, 505 * MIB + MIB + 1]), "one reading beyond the band");
    }

    /// An excerpt of the server's real `/metrics`.
    #[test]
    fn parses_metrics() {
        let text = "# HELP fencelock_log_entries_total Log entries written by this node's driver.\n\
            # TYPE fencelock_log_entries_total counter\nfencelock_log_entries_total 1234\n\
            # HELP fencelock_log_commands_total Commands written in those entries.\n\
            # TYPE fencelock_log_commands_total counter\nfencelock_log_commands_total 567890\n\
            # HELP fencelock_lease_expirations_total Leases that expired.\n\
            # TYPE fencelock_lease_expirations_total counter\nfencelock_lease_expirations_total 0\n\
            # HELP fencelock_active_leases Live leases.\n\
            # TYPE fencelock_active_leases gauge\nfencelock_active_leases 20000\n\
            # HELP fencelock_held_locks Locks currently held.\n\
            # TYPE fencelock_held_locks gauge\nfencelock_held_locks 19999\n\
            fencelock_wait_seconds_bucket{le=\"0.001\"} 3\n";
        let c = ServerCounters::parse(text).unwrap();
        assert_eq!(
            c,
            ServerCounters { entries: 1234, commands: 567890, active_leases: 20000, held_locks: 19999, expirations: 0 }
        );
        assert!(ServerCounters::parse("fencelock_log_entries_total 1\n").is_err(), "missing metrics are an error");
    }
}
