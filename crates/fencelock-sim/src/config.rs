//! What one simulation run is: its seed, its size, its timings, and which known
//! bug (mutant) is switched back on.
//!
//! The workload ([`Workload`]) says whether clients take the lock exclusively
//! only, or also shared and as semaphore permits.
//!
//! Every timing here is virtual (turmoil's clock), so a run of 20 s of simulated
//! time takes a fraction of a second of real time. The client timings are derived
//! from the lease TTL the way a real client derives them (keep-alive every TTL/3).

use fencelock_core::Millis;

/// A known bug to re-introduce, to prove that a checker can fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mutant {
    /// The system as designed.
    #[default]
    None,
    /// The resource ignores fencing tokens and accepts every write
    /// (INV-FENCE must go red).
    UnfencedResource,
    /// The server applies and answers a batch before it is durable
    /// (INV-TOKENS must go red after a crash).
    ReplyBeforePersist,
    /// The driver handles `CancelWait` as `fencelock-server`'s driver does today:
    /// a cancel for a caller that went away is written even when a retry of the
    /// same (lease, req) has arrived since, and waiters are registered from the
    /// `Queued` reply, so the cancel's `WaitEnded{Cancelled}` in the same batch
    /// wakes the retry: its caller gives up while its acquire stays queued, and
    /// the later grant is orphaned; or the retry is granted first and the
    /// cancel releases it under its client (INV-EXCL goes red at seed 20 of
    /// the CI seeds, `tests/it/inv_exclusive.rs`; INV-HEAL caught the orphaned
    /// grant only in the simulator's former model of the driver: see the crate
    /// docs).
    RacyCancel,
    /// The server pushes only the first grant of a queued multi-acquire's
    /// `GrantedAll` (what this driver did while no simulated client asked for
    /// several locks): the client believes it holds a strict subset of its
    /// locks (INV-MULTI must go red).
    PartialMultiPush,
}

impl std::str::FromStr for Mutant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Mutant::None),
            "unfenced-resource" => Ok(Mutant::UnfencedResource),
            "reply-before-persist" => Ok(Mutant::ReplyBeforePersist),
            "racy-cancel" => Ok(Mutant::RacyCancel),
            "partial-multi-push" => Ok(Mutant::PartialMultiPush),
            other => Err(format!(
                "unknown mutant {other:?} (none, unfenced-resource, reply-before-persist, racy-cancel, partial-multi-push)"
            )),
        }
    }
}

/// What the clients ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workload {
    /// Every client takes the lock exclusively and writes (the original run).
    #[default]
    Exclusive,
    /// Read-write lock and semaphore (issue 18): each round a client is a
    /// reader (shared, reads), a writer (exclusive, writes, and half the time
    /// downgrades and reads again with its token) or a permit holder of the
    /// semaphore [`SEMAPHORE`] ([`PERMITS`] permits, weight 1 or 2, uses it),
    /// or a multi-acquirer: two or three of [`MULTI_LOCKS`] in one
    /// `Acquire` (its `also`), in a rotated and maybe reversed order so that
    /// clients cross, writing each lock's own register with that lock's token.
    Mixed,
}

impl Workload {
    /// The short profile's share: every third seed runs [`Workload::Mixed`].
    pub fn for_seed(seed: u64) -> Self {
        if seed.is_multiple_of(3) {
            Workload::Mixed
        } else {
            Workload::Exclusive
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exclusive" => Ok(Workload::Exclusive),
            "mixed" => Ok(Workload::Mixed),
            other => Err(format!("unknown workload {other:?} (exclusive, mixed)")),
        }
    }
}

/// One simulation run. Everything random in the run derives from `seed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    pub seed: u64,
    /// Client hosts, each with its own lease and keep-alive.
    pub clients: usize,
    /// Virtual time simulated, in milliseconds.
    pub duration_ms: Millis,
    /// The lease TTL every client asks for.
    pub ttl_ms: u64,
    pub mutant: Mutant,
    pub workload: Workload,
    /// Most log writes the server's driver keeps in flight (1 is one at a
    /// time, the real server's default; runs default to [`SIM_MAX_INFLIGHT`]).
    pub max_inflight: usize,
}

/// The lock every client contends for (read-write in [`Workload::Mixed`]).
pub const LOCK: &str = "resource";
/// The semaphore of [`Workload::Mixed`].
pub const SEMAPHORE: &str = "permits";
/// Its permit count.
pub const PERMITS: u32 = 3;
/// The read-write locks of [`Workload::Mixed`]'s multi-acquires, each guarding
/// its own register at the resource.
pub const MULTI_LOCKS: [&str; 3] = ["multi-a", "multi-b", "multi-c"];
/// Log writes in flight in the runs of odd seeds unless set: more than the
/// server's default of 1, so the CI seeds check the pipelined driver (odd
/// seeds) and the default (even seeds) alike.
pub const SIM_MAX_INFLIGHT: usize = 4;
/// Port of the lock server's line protocol.
pub const SERVER_PORT: u16 = 7070;
/// Port of the fenced resource.
pub const RESOURCE_PORT: u16 = 7080;
/// One-way network latency bounds (turmoil draws from an exponential inside).
pub const MIN_LATENCY_MS: u64 = 1;
pub const MAX_LATENCY_MS: u64 = 15;
/// Time allowed, on top of 2 × TTL, for the server to come back after a restart
/// (replay, persist `LeaderStart`) and for clients to reconnect (INV-HEAL).
pub const RESTART_SLACK_MS: u64 = 250;

impl SimConfig {
    /// The default run for `seed`: 4 clients, 600 ms TTL, 20 s of virtual time,
    /// the workload [`Workload::for_seed`] gives it.
    pub fn new(seed: u64) -> Self {
        let workload = Workload::for_seed(seed);
        let max_inflight = if seed % 2 == 1 { SIM_MAX_INFLIGHT } else { 1 };
        Self { seed, clients: 4, duration_ms: 20_000, ttl_ms: 600, mutant: Mutant::None, workload, max_inflight }
    }

    pub fn with_max_inflight(mut self, n: usize) -> Self {
        self.max_inflight = n.max(1);
        self
    }

    pub fn with_workload(mut self, workload: Workload) -> Self {
        self.workload = workload;
        self
    }

    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.mutant = mutant;
        self
    }

    /// How often a client renews its lease.
    pub fn keepalive_every_ms(&self) -> u64 {
        self.ttl_ms / 3
    }

    /// How long a client waits for the answer to one request before it gives the
    /// connection up (turmoil drops segments during a partition, so a stalled
    /// connection never recovers by itself).
    pub fn request_timeout_ms(&self) -> u64 {
        (self.ttl_ms / 4).max(8 * MAX_LATENCY_MS)
    }

    /// How long a queued acquire may wait on the server.
    pub fn acquire_wait_ms(&self) -> u64 {
        3 * self.ttl_ms
    }

    /// INV-HEAL: after a fault ends, a new grant and an accepted write come
    /// within this long.
    pub fn heal_bound_ms(&self) -> u64 {
        2 * self.ttl_ms + RESTART_SLACK_MS
    }

    /// A client pause lasts between 1.5 and 5 TTLs (the Kleppmann case).
    pub fn pause_range_ms(&self) -> (u64, u64) {
        (self.ttl_ms * 3 / 2, self.ttl_ms * 5)
    }
}
