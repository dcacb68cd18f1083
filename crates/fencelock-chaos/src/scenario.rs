//! What a run is: a scenario (the fault), a backend, a seed, a duration, an
//! optional mutant; and what each scenario must prove happened.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::bail;
pub use fencelock_server::LogEngine;
use serde::{Deserialize, Serialize};

/// The faults (ids as in `docs/scenarios.md`, the catalogue). S6, heal after
/// every fault, is checked in every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Scenario {
    /// A holder stopped with SIGSTOP after its last check, before its write,
    /// for 1.5–5 × TTL.
    K1,
    /// A holder's traffic (keep-alives and its write) held in a TCP proxy for
    /// 1.5–5 × TTL; the held write arrives late.
    K2,
    /// The lock server's clock runs fast or slow and jumps forward (the fault
    /// clock of `FENCELOCK_FAULT_CLOCK`, see `fencelock_chaos::faults::clock`).
    K3,
    /// The lock server SIGKILLed and restarted, or crashed at a failpoint
    /// around fsync and reply.
    K4,
    /// A waiter's keep-alives blocked past its TTL, then the holder releases:
    /// the lock must not go to the dead waiter.
    S1,
    /// A client's connection loses the answers and is reset after the request
    /// was sent; the client retries: exactly one grant.
    S4,
    /// Power loss: the server killed, its unsynced bytes dropped and its last
    /// write torn, then restarted.
    S5,
    /// A 3-node group's leader SIGKILLed every 1–3 s and restarted once
    /// another leads.
    L1,
    /// A 3-node group's leader cut off from both peers for 1–3 s beyond the
    /// election of a new leader.
    L2,
    /// One node of a 3-node group, the leader or a follower, cut off from the
    /// other two (a minority of one) for 1–3 s.
    L3,
    /// Peer input: malformed Raft payloads, snapshots whose data does not
    /// decode, and forged snapshots that would send the token counter back,
    /// sent to the server's gRPC port in rounds (see `peer_input`; under
    /// `--tls`, over TLS with a member's node certificate). Not
    /// well-formed `AppendEntries` or `Vote` of a higher term: from a member
    /// those move the term (P2 sends them as a non-member, under TLS).
    P1,
    /// Forged peer under TLS: the server runs with TLS and an auth file, and
    /// well-formed `Vote`, `AppendEntries` of a term far above the node's and
    /// the rollback snapshot are sent from connections without a node
    /// certificate (none, or a client certificate): every one refused
    /// UNAUTHENTICATED, the term unmoved (see `peer_tls`).
    P2,
}

pub const ALL: &[Scenario] = &[
    Scenario::K1,
    Scenario::K2,
    Scenario::K3,
    Scenario::K4,
    Scenario::S1,
    Scenario::S4,
    Scenario::S5,
    Scenario::L1,
    Scenario::L2,
    Scenario::L3,
    Scenario::P1,
    Scenario::P2,
];

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl FromStr for Scenario {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        ALL.iter().copied().find(|x| x.to_string().eq_ignore_ascii_case(s)).ok_or_else(|| {
            anyhow::anyhow!("unknown scenario {s:?} (one of K1, K2, K3, K4, S1, S4, S5, L1, L2, L3, P1, P2)")
        })
    }
}

impl Scenario {
    /// Why this scenario cannot run against `backend`, if it cannot.
    pub fn unsupported(self, backend: &str) -> Option<&'static str> {
        let native = backend == "fencelock";
        let group = backend == "fencelock3";
        match self {
            Scenario::L1 | Scenario::L2 | Scenario::L3 if !group => {
                Some("needs a group of nodes: the fencelock3 backend")
            }
            Scenario::P1 | Scenario::P2 if !native => Some(
                "sends Raft messages to one fencelock node and reads its admin counters; every node of a group runs \
                 the same checks, and the group itself is not targeted yet",
            ),
            Scenario::K1 | Scenario::L1 | Scenario::L2 | Scenario::L3 => None,
            _ if group => Some("against the 3-node group the suite runs K1 and the L scenarios"),
            _ if backend == "fencelock-json" => {
                Some("the HTTP API's workers run K1 (pauses past the TTL); the node's own faults run over gRPC")
            }
            _ if backend == "fencelock-py" => {
                Some("the Python package's workers run K1 (pauses past the TTL); the node's own faults run in Rust")
            }
            Scenario::K2 if backend == "redlock" => {
                Some("Redlock talks to several nodes; one proxy cannot hold them all")
            }
            Scenario::K3 if !native => {
                Some("the injected clock is fencelock's own (a peer engine's clock cannot be skewed here)")
            }
            Scenario::S1 | Scenario::S4 if !native => {
                Some("needs the native server's admin view of queues and counters")
            }
            Scenario::S5 if !native => Some("the power-loss shim sits under fencelock's own storage"),
            _ => None,
        }
    }

    /// The evidence kinds a run must show (else it is inconclusive).
    pub fn required_evidence(self) -> Vec<String> {
        let what: &[&str] = match self {
            Scenario::K1 => &["stopped"],
            Scenario::K2 => &["held-bytes"],
            Scenario::K3 => &["clock", "wall-clock", "client-clock"],
            Scenario::K4 => &["restarted"],
            Scenario::S1 => &["trial"],
            Scenario::S4 => &["reset"],
            Scenario::S5 => &["restarted", "rolled-back"],
            Scenario::L1 => &["leader-killed", "new-leader"],
            Scenario::L2 => &["isolated", "new-leader"],
            Scenario::L3 => &["isolated"],
            Scenario::P1 => &["refused", "serving"],
            Scenario::P2 => &["refused", "term-unmoved", "serving"],
        };
        what.iter().map(|s| s.to_string()).collect()
    }

    /// Writes the fence must have refused for the run to show anything.
    pub fn min_stale_rejects(self) -> u64 {
        match self {
            // K3's slow client writes past its lease at every such fault.
            Scenario::K1 | Scenario::K2 | Scenario::K3 => 1,
            _ => 0,
        }
    }

    /// Whether the native server must run with TLS and an auth file.
    pub fn needs_tls(self) -> bool {
        self == Scenario::P2
    }

    /// Why this scenario cannot run against `backend` under TLS and auth
    /// (`--tls`), if it cannot. Every scenario fencelock's own server runs (a
    /// node or the 3-node group) runs under TLS too; P1 then speaks as a
    /// member (a node certificate), so that its malformed messages reach the
    /// decoder.
    pub fn unsupported_with_tls(self, backend: &str) -> Option<&'static str> {
        match backend {
            "fencelock" | "fencelock3" => None,
            _ => Some("TLS and auth are set up for fencelock's own server only (a node or a 3-node group)"),
        }
    }

    /// Whether the run restarts the lock service.
    pub fn restarts(self) -> bool {
        matches!(self, Scenario::K4 | Scenario::S5)
    }
}

/// Deliberately broken builds that the suite must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutant {
    /// The storage server carries out stale writes (`--unfenced`).
    FencingOff,
    /// The lock server forgets its token counter on restart.
    MemoryToken,
    /// The engine hands a lock to a waiter whose lease has expired.
    DeadWaiter,
    /// Shared mode: the workers' reads leave without their token, so the
    /// storage serves them unfenced (a fence that forgot reads): a reader
    /// paused past its lease reads after a newer writer wrote.
    ReadsUnfenced,
    /// Multi mode: a worker's multi-acquire takes the locks one by one with
    /// plain acquires, in its shuffled order, and records them as one multi
    /// grant (Curator's multi-lock, not an atomic one): its tokens are not
    /// consecutive when another grant came between.
    MultiOneByOne,
    /// S5 on the segment log: its files' `sync_data` does nothing (a log
    /// that acknowledges before its fsync), so a power loss drops
    /// acknowledged entries. The node detects the loss at its restart (its
    /// committed index, in redb, is past the log) and refuses to start,
    /// which S5 records as the run's outcome: the grant held at the kill is
    /// not read back (C6), and nothing is written after (S6).
    WalNoSync,
}

impl Mutant {
    pub fn name(self) -> &'static str {
        match self {
            Mutant::FencingOff => "fencing-off",
            Mutant::MemoryToken => "memory-token",
            Mutant::DeadWaiter => "dead-waiter",
            Mutant::ReadsUnfenced => "reads-unfenced",
            Mutant::MultiOneByOne => "multi-one-by-one",
            Mutant::WalNoSync => "wal-no-sync",
        }
    }
}

impl FromStr for Mutant {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "fencing-off" => Mutant::FencingOff,
            "memory-token" => Mutant::MemoryToken,
            "dead-waiter" => Mutant::DeadWaiter,
            "reads-unfenced" => Mutant::ReadsUnfenced,
            "multi-one-by-one" => Mutant::MultiOneByOne,
            "wal-no-sync" => Mutant::WalNoSync,
            _ => {
                bail!(
                    "unknown mutant {s:?} (fencing-off, memory-token, dead-waiter, reads-unfenced, multi-one-by-one, \
                     wal-no-sync)"
                )
            }
        })
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub scenario: Scenario,
    pub backend: String,
    pub seed: u64,
    pub duration: Duration,
    pub workers: u32,
    /// Asked TTL; raised to the backend's minimum.
    pub ttl: Duration,
    pub mutant: Option<Mutant>,
    /// fencelock (a node or the group) runs with TLS and an auth file (the
    /// native server always for P2).
    pub tls: bool,
    /// Election mode: the workers campaign for the lock as an election and
    /// resign (see `worker_process`), and observers follow its leader (`observers`).
    pub election: bool,
    /// Shared mode (read-write locks, issue 18): each cycle a worker is a
    /// reader (a shared acquire and a fenced read) with probability 0.7, else
    /// a writer (the exclusive read-modify-write cycle), and an observer polls
    /// the lock's holders (`observers::HolderPolls`); the checks R1 and R2
    /// are added.
    pub shared: bool,
    /// Semaphore mode when above 0: the lock is a semaphore of this many
    /// permits, each worker takes one and read-modify-writes an object of its
    /// own (`<key>-w<i>`), and the holder observer polls the permits in use;
    /// C3, C4 are checked per object and R2 is added.
    pub permits: u32,
    /// Multi mode when above 0 (atomic multi-locks, issue 18): this many
    /// locks `chaos-m<i>`, each guarding its own object `chaos-object-m<i>`;
    /// each cycle a worker takes all of them at once (`acquire_all`, in an
    /// order it shuffles) or one of them, and read-modify-writes the object
    /// of each lock it holds with that lock's token; M1 is added, and C3, C4
    /// and C6 are judged per lock.
    pub multi: u32,
    /// The Raft log of fencelock's own servers (a node or the group): the
    /// product's default, the segment log, or redb (`--log redb`).
    pub log: LogEngine,
    /// The Python interpreter of the `fencelock-py` backend's workers (one
    /// that imports the fencelock package).
    pub python: PathBuf,
    /// S6's allowance for a loaded machine, on top of its bound (see
    /// `RunInfo::heal_slack_ms`).
    pub heal_slack: Duration,
    /// Where the histories, logs and verdict go.
    pub out: PathBuf,
}

/// The name of `log` when it is not the product's default engine (`None` for
/// the default): a run on another engine says so in its directory's name and
/// its backend label (`fencelock (redb log)`); a run without it ran on the
/// engine a plain `fencelock serve` uses.
pub fn non_default_log(log: LogEngine) -> Option<&'static str> {
    (log != LogEngine::default()).then(|| log.name())
}

/// The run's lock: every worker contends for it (multi mode: for
/// [`multi_name`]s made from it).
pub const LOCK: &str = "chaos";

/// Multi mode's name of lock or object `i` from the run's `base` name
/// (`chaos` → `chaos-m0`, `chaos-object` → `chaos-object-m0`).
pub fn multi_name(base: &str, i: u32) -> String {
    format!("{base}-m{i}")
}
