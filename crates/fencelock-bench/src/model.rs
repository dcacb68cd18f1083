//! The results of one benchmark run, as written to `results.json` and read by
//! the markdown report and the charts.
//!
//! Where it sits: the workloads ([`crate::workload`], [`crate::scale`],
//! [`crate::durability`], [`crate::failover`]) fill these records;
//! [`crate::report`] and [`crate::chart`] only read them; it imports none of
//! them. Every figure is what was measured in this run; nothing is copied
//! from elsewhere.

use serde::{Deserialize, Serialize};

/// One whole run of `fencelock-bench`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// UTC start of the run, RFC 3339 (for the record only; no figure uses it).
    pub started: String,
    /// `quick` (every cell runs briefly: a smoke check, not figures) or `full`.
    pub mode: String,
    /// The command line that produced this report, as a user would type it
    /// (the program by name, paths relative to the checkout).
    pub command: String,
    pub machine: Machine,
    pub settings: Settings,
    /// The engines measured, in the order they were started.
    pub engines: Vec<EngineInfo>,
    /// W1 (uncontended cycles) and W2 (contended handoff) cells.
    pub cells: Vec<Cell>,
    /// W3: native scale (absent if not run).
    pub scale: Option<Scale>,
    /// W4: native durability accounting (absent if not run).
    pub durability: Option<Durability>,
    /// W6: election fail-over, per engine and fault (empty if not run).
    #[serde(default)]
    pub elections: Vec<Failover>,
    /// The targets, evaluated on this run's figures.
    pub targets: Vec<Target>,
}

/// What the run was measured on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_gib: f64,
    pub kernel: String,
    /// Filesystem type holding the engines' data directories (all engines share it).
    pub data_fs: String,
    pub rustc: String,
    /// fencelock's git commit, if known.
    pub commit: String,
}

/// Run settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    /// Measured seconds per run of one cell.
    pub seconds: f64,
    /// Warm-up seconds before each measured run (not counted).
    pub warmup: f64,
    /// Runs per cell; engines are interleaved run by run.
    pub runs: usize,
    /// Lease TTL every engine was asked for, ms.
    pub ttl_ms: u64,
}

/// One engine (a lock service plus the recipe the client library uses on it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineInfo {
    /// Short id used in cells and charts: `fencelock`, `fencelock-3` (a 3-node
    /// group), `redis`, `redis-aof`,
    /// `etcd`, `zookeeper`, `postgres`, `pg-advisory`, `redis-setnx`, `redis-setnx-aof`.
    pub id: String,
    /// Human label, e.g. "Redis 7.0.15, no AOF".
    pub label: String,
    /// Server version string as reported by the server or its package.
    pub version: String,
    /// Acknowledged grants survive a crash (fsync before the reply).
    pub durable: bool,
    /// Fencing tokens: `global`, `per lock` or `none`.
    pub fencing: String,
    /// Waiters served first come first served.
    pub fifo: bool,
    /// Whether the engine's process CPU could be read (started here, or a pid given).
    pub cpu_measured: bool,
    /// How the server was configured, in one line (`given by URL` for an
    /// engine not started here; empty in results written before it was recorded).
    #[serde(default)]
    pub config: String,
    /// True when all of a cell's clients share one connection (one `Backend`)
    /// of the library; false when each client has its own, as separate
    /// processes would (see `workload.rs`).
    #[serde(default)]
    pub shared_connection: bool,
}

/// Percentiles of a latency distribution, milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub samples: u64,
}

/// One measured run of one cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Completed acquire → release cycles while measuring.
    pub cycles: u64,
    pub seconds: f64,
    pub cycles_per_sec: f64,
    /// Acquire call → grant returned.
    pub acquire_ms: Latency,
    /// The engine process's CPU (user + system, its children included; summed
    /// over the nodes of a group) per cycle, µs; `None` when a process could not
    /// be read.
    pub cpu_us_per_cycle: Option<f64>,
    /// The benchmark process's own CPU per cycle, µs: the client library and
    /// its connections (all clients of the run share this process and the
    /// machine's cores with the engine).
    pub client_cpu_us_per_cycle: Option<f64>,
    /// W2 and W5: holder starts its release → the next holder's acquire returns
    /// (W5: per lock, see `workload.rs`).
    pub handoff_ms: Option<Latency>,
    /// W2 only: max / min grants per client.
    pub fairness: Option<f64>,
    /// W2 only: clients that got no grant in the window (fairness is then `None`).
    pub starved_clients: Option<u64>,
    /// W2 only: share of grants that went back to the client that had just released.
    pub self_regrant_share: Option<f64>,
    /// W2 only: grants that went back to the releasing client although another
    /// client's acquire was already waiting when the release started.
    pub self_regrant_while_others_waited: Option<u64>,
    /// Operations that failed (an error, not contention).
    pub errors: u64,
}

/// One (workload, engine, clients) cell with every run and the median.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// `W1`, `W2`, `W5-rw` or `W5-sem`.
    pub workload: String,
    pub engine: String,
    pub clients: usize,
    /// Distinct locks: equal to `clients` in W1, 1 in W2 and W5-sem, 4 in W5-rw.
    pub locks: usize,
    pub runs: Vec<RunResult>,
    /// The run with the median throughput (its other figures come with it).
    pub median: RunResult,
}

/// W3: many live leases on the native server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scale {
    /// Leases created, each holding one lock of its own.
    pub leases: u64,
    /// Seconds to create all leases and their locks (grant + acquire each),
    /// in the run reported: the median of [`Scale::create_seconds_runs`].
    pub create_seconds: f64,
    /// Every run's create time, in run order, each on a fresh server
    /// (absent in results written before W3 ran more than once).
    #[serde(default)]
    pub create_seconds_runs: Vec<f64>,
    pub creates_per_sec: f64,
    /// Server CPU (user + system, every thread) per create while creating,
    /// µs (0 in results written before W3 read it).
    #[serde(default)]
    pub create_server_cpu_us: f64,
    /// The bench process's own CPU per create while creating, µs: the
    /// client library and its sessions (0 in results written before W3 read it).
    #[serde(default)]
    pub create_client_cpu_us: f64,
    /// Server resident memory before creating anything, bytes.
    pub rss_before: u64,
    /// Server resident memory a second after the last create, bytes (absent
    /// in results written before [`Scale::rss_after`] waited for it to settle,
    /// whose `rss_after` is this reading).
    #[serde(default)]
    pub rss_after_create: u64,
    /// Server resident memory with all leases live and idle, once it stopped
    /// falling (the last 2 s of readings within 1 MiB; at most 30 s after
    /// `rss_after_create`), bytes.
    pub rss_after: u64,
    /// Seconds from `rss_after_create` to `rss_after` (absent: not waited for).
    #[serde(default)]
    pub settle_seconds: f64,
    /// (rss_after - rss_before) / leases.
    pub bytes_per_lease: f64,
    /// Leases that renew during the CPU measurement.
    pub renewing: u64,
    /// Their TTL, ms; they renew every TTL/3.
    pub renew_ttl_ms: u64,
    /// Keep-alives acknowledged during the measurement.
    pub renewals: u64,
    pub renew_seconds: f64,
    /// Server CPU (user + system) over wall time while renewing: 1.0 = one core.
    pub renew_cpu_cores: f64,
    /// Server CPU µs per renewal.
    pub cpu_us_per_renewal: f64,
    /// Keep-alives that failed, from the first renewing lease's creation to the
    /// end of the measurement: an error, or the lease had already ended (must be 0).
    pub renew_failures: u64,
    /// Creates (grant + acquire) that failed (must be 0).
    pub create_failures: u64,
    /// Sessions (one connection each) the leases were created through.
    pub create_sessions: u64,
    /// Creates in flight at once, over all sessions.
    pub create_in_flight: u64,
    /// Log entries the server wrote while creating (its `fencelock_log_entries_total`).
    pub create_log_entries: u64,
    /// Commands in those entries (`fencelock_log_commands_total`): grants, acquires,
    /// and the renewing leases' keep-alives.
    pub create_log_commands: u64,
    /// Group commit while creating: commands per log entry.
    pub create_commands_per_entry: f64,
    /// Log entries written during the renewal measurement.
    pub renew_log_entries: u64,
    /// Commands in them (keep-alives).
    pub renew_log_commands: u64,
    /// Slowest keep-alive acknowledgement of the run, ms (against a TTL of `renew_ttl_ms`).
    pub renew_max_latency_ms: f64,
    /// Renewing leases a keep-alive found ended (must be 0).
    pub renewing_lost: u64,
    /// The server's live leases at the end (its `fencelock_active_leases`; should equal `leases`).
    pub live_leases_end: u64,
    /// The server's held locks at the end (`fencelock_held_locks`; should equal `leases`).
    pub held_locks_end: u64,
    /// Leases that expired on the server during the run (must be 0).
    pub lease_expirations: u64,
}

/// W4: fsyncs per acknowledged operation on the native server, and the check
/// that every acknowledged grant was durable.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Durability {
    /// Clients (each on its own lock) during the measurement.
    pub clients: usize,
    /// Operations acknowledged to the clients while strace counted (lease
    /// grants + grants + releases + keep-alives, each counted by the client).
    pub acknowledged_ops: u64,
    /// Of which grants.
    pub acknowledged_grants: u64,
    /// Successful fsync, fdatasync, sync_file_range and syncfs calls by the
    /// server process (every thread) while measuring, counted by `strace -f -c`.
    pub fsyncs: u64,
    pub fsyncs_per_op: f64,
    /// How the server was stopped before the check (SIGKILL).
    pub stop: String,
    /// Acknowledged grants kept until the kill and found after the restart:
    /// the lock's holder is still the same lease with the same token.
    pub grants_verified: u64,
    /// Acknowledged grants missing after the restart (must be 0).
    pub grants_missing: u64,
    /// Highest token acknowledged before the kill, and the first token granted
    /// after the restart (must be larger).
    pub max_token_before: u64,
    pub first_token_after: u64,
    /// Seconds of the strace-counted window.
    pub seconds: f64,
    /// Acknowledged operations per second in that window (strace slows the
    /// server down: not a throughput figure).
    pub ops_per_sec: f64,
    /// Of `acknowledged_ops`: releases, lease grants and keep-alives.
    pub acknowledged_releases: u64,
    pub acknowledged_lease_grants: u64,
    pub acknowledged_keep_alives: u64,
    /// Operations that failed in the window (must be 0).
    pub errors: u64,
    /// Log entries the server wrote in the window (its `fencelock_log_entries_total`).
    pub log_entries: u64,
    /// Commands in those entries (`fencelock_log_commands_total`).
    pub log_commands: u64,
    /// fsyncs per log entry (one group commit).
    pub fsyncs_per_entry: f64,
    /// Commands per log entry in the window.
    pub commands_per_entry: f64,
    /// Grants kept until the kill (one per client): `grants_verified + grants_missing`.
    pub grants_held: u64,
    /// Operations a background load (as many clients, cycling on locks of
    /// their own) had acknowledged when the kill came; it was still running.
    pub background_ops_at_kill: u64,
    /// From the SIGKILL to the restarted server serving again, s.
    pub restart_seconds: f64,
}

/// One target of the issue, evaluated on this run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// E.g. "W1 64 clients: fencelock / Redis (no AOF)".
    pub name: String,
    /// `>=` or `<=`.
    pub op: String,
    pub goal: f64,
    /// The measured value (a ratio or an absolute figure), if it could be computed.
    pub measured: Option<f64>,
    /// Unit of goal and measured, e.g. "×", "ms", "bytes".
    pub unit: String,
    pub met: Option<bool>,
}

/// W6: how the leader is taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// SIGKILL: the process and its connections are gone.
    Kill,
    /// SIGSTOP: the process is frozen with its connections open.
    Stop,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Stop => "SIGSTOP",
        }
    }
}

/// W6: the fail-over times of one engine under one fault.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failover {
    pub engine: String,
    pub fault: Fault,
    /// The candidates' lease TTL, the same for every engine.
    pub ttl_ms: u64,
    /// Each sample: signal → the observer sees a higher term, in ms.
    pub samples_ms: Vec<f64>,
    pub median_ms: f64,
    pub max_ms: f64,
}
