//! The history of a run: one JSON line per event, written by every worker and
//! by the harness (nemesis, observations), merged by time for the checkers.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, a clock shared by every process of
//! the machine, so events of different processes compare. An operation is an
//! `invoke` event followed by one completion with the same `(p, f, seq)`:
//! `ok` (it happened), `fail` (it certainly did not happen) or `unknown` (it
//! may or may not have happened: a timeout, a reset, a crash). An invoke with
//! no completion is `unknown` too. The harness's own facts are `note`s.

use std::io::{self, BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn mono_ns() -> u64 {
    // A raw system call, not libc's clock_gettime: a process running under
    // libfaketime (K3) has that one replaced, and the histories of all
    // processes must share the kernel's clock.
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the kernel to fill.
    let rc = unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, &mut ts as *mut libc::timespec) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Unknown,
    Note,
}

/// The operation (workers) or the fact (harness notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    // ---- worker operations (invoke + completion) ----
    /// Acquire the lock; `ok` carries `token` (if the backend fences) and
    /// `lease`; `shared` on both events for a reader's acquire (shared mode).
    /// Multi mode: both events name the locks asked, in order (`locks`); a
    /// multi-acquire's `ok` carries one token per lock in that order
    /// (`tokens`) and no `token`.
    Acquire,
    /// Fenced read of the object with `token`; `ok` carries `value`; `fail`
    /// with `stale: true` when the storage refused the token (409), `fail`
    /// with `skipped: true` when a reader's last check found its lease gone
    /// and it did not send the read.
    Read,
    /// Fenced write of the object with `token`, appending `append`; `fail`
    /// with `stale: true` when the storage refused the token (409), `fail` with
    /// `skipped: true` when the worker's last check found its lease gone and it
    /// did not send the write.
    Write,
    /// Release the lock (compare-and-delete with `token`); `ok` carries
    /// `released`. Multi mode: `locks` and, for a multi grant, `tokens`, as
    /// on its acquire (`released`: every lock was still held).
    Release,
    /// Election mode: campaign for the election (the run's lock name) with
    /// the value `<p>-<seq>`; `ok` (elected) carries the term as `token` and
    /// `lease`. A campaign the worker gave up waiting for is `unknown`: it may
    /// have been granted before the worker withdrew.
    Campaign,
    /// Election mode: resign the leadership of `token` (the term); `ok`
    /// carries `released`, `false` when it had been lost before.
    Resign,
    // ---- harness notes ----
    /// A fault began or ended: `fault` (scenario id), `phase` ("start"/"end"),
    /// `target` ("w3", "server", "storage"), `detail`.
    Fault,
    /// Proof that a fault really happened: `what` ("stopped", "held-bytes",
    /// "restarted", "rolled-back", "clock", "reset", "failpoint"), `count`,
    /// `target`, `detail`.
    Evidence,
    /// The lock server came back after a kill: `detail` has `old_pid`,
    /// `new_pid`, `cause`, `killed_at` (ns).
    Restart,
    /// The lock's holder as the server reports it (`describe`), right after a
    /// restart (`detail.killed_at`) or after an S1 release: `lease`, `token`
    /// (both absent if nobody holds it).
    Holder,
    /// One S1 trial: `detail` has `dead_lease`, `holder_after` (lease or
    /// null), `probe` ("acquired" if a live client got the lock right after
    /// the release), `waiter_outcome` ("acquired", "not-acquired", "error: …").
    S1Trial,
    /// Server counters at the end: `detail.tokens_issued`, `detail.grants_cancelled`
    /// (grants released undelivered because their caller had gone),
    /// `detail.grants_expired` (grants ended by their lease's expiry),
    /// `detail.grants_revoked` (by a revoke, counted before the workers stop).
    ServerStats,
    /// An object's final contents, read at the end: `value`; `target` its
    /// key (semaphore mode reads every worker's object).
    FinalRead,
    /// Election mode: one `LeaderEvent` an observer (`p` = `o0`, `o1`)
    /// received, at `t` = its receive time: `what` "leader" (with `token` the
    /// term, `value` [the leader's value]) or "vacant" (`token` the term that
    /// ended).
    Observed,
    /// Election mode: an observer (re)subscribed (`observe`); what ended its
    /// previous stream, if one did, is in `error`.
    Subscribed,
    /// A grant + fenced write succeeded after a fault ended: `detail.fault_end`
    /// (ns) and `detail.healed_after_ms`.
    Heal,
    /// Shared mode: one poll of the lock's holders (`describe`) by the holder
    /// observer (`p` = `d0`), at `t` = when the answer arrived: `detail` has
    /// `holders` (each `mode` "shared"/"exclusive", `token`, `lease`,
    /// `ttl_left_ms`, `weight`) and `permits` (0: not a semaphore). Only
    /// polls that succeeded are written.
    Holders,
    /// The lock service's audit logs, read at the end of a run under TLS and
    /// auth: `count` calls refused (unauthenticated, denied, over a limit),
    /// `detail.files` read, `detail.examples`; or `detail.error`.
    AuthAudit,
}

/// One line of a history file. Fields not used by an event are absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `CLOCK_MONOTONIC` ns.
    pub t: u64,
    /// The process: `w0`, `w1`, … for workers, `nemesis`, `harness`.
    pub p: String,
    pub kind: Kind,
    pub f: Op,
    /// The worker's cycle number: pairs an invoke with its completion.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// Read / write: the object's key (with `p`, `f` and `seq`, it pairs
    /// the invoke with its completion: a multi-holder's cycle reads and
    /// writes several objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Multi mode's acquire and release: the locks, in the order asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locks: Option<Vec<String>>,
    /// A multi grant's tokens, one per lock of `locks`, in that order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u64>>,
    /// Write: the unique id this write appends (`w3-17`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<String>,
    /// Read / final read: the object's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Write refused by the fence (409).
    #[serde(default, skip_serializing_if = "is_false")]
    pub stale: bool,
    /// Write not sent: the worker's last check found the lease gone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub skipped: bool,
    /// Refused by the lock service's authentication (UNAUTHENTICATED or
    /// PERMISSION_DENIED): nothing was done, and the run fails (A1).
    #[serde(default, skip_serializing_if = "is_false")]
    pub refused: bool,
    /// Acquire: a reader's (shared) acquire of a read-write lock.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared: bool,
    /// Release: whether the backend said the lock was still ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    /// Fault: scenario id (`K1`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Fault: `start` / `end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Evidence: what was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub what: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

impl Op {
    /// A grant of the lock: an acquire, or a campaign (a leadership is a grant).
    pub fn is_grant(self) -> bool {
        matches!(self, Op::Acquire | Op::Campaign)
    }

    /// The end of a grant by its holder: a release, or a resignation.
    pub fn is_release(self) -> bool {
        matches!(self, Op::Release | Op::Resign)
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Event {
    /// A bare event at `t`; fill in the rest with struct update syntax.
    pub fn new(t: u64, p: impl Into<String>, kind: Kind, f: Op) -> Self {
        Event {
            t,
            p: p.into(),
            kind,
            f,
            seq: 0,
            token: None,
            lease: None,
            key: None,
            locks: None,
            tokens: None,
            append: None,
            value: None,
            error: None,
            stale: false,
            skipped: false,
            refused: false,
            shared: false,
            released: None,
            fault: None,
            phase: None,
            target: None,
            what: None,
            count: None,
            detail: serde_json::Value::Null,
        }
    }

    /// A harness note, now.
    pub fn note(p: impl Into<String>, f: Op) -> Self {
        Event::new(mono_ns(), p, Kind::Note, f)
    }
}

/// Appends events to a JSON-lines file, flushing each line (a stopped or
/// killed process loses at most the line it was writing).
pub struct Writer {
    out: io::BufWriter<std::fs::File>,
}

impl Writer {
    pub fn create(path: &Path) -> io::Result<Self> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Writer { out: io::BufWriter::new(f) })
    }

    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

/// Reads one history file. A torn last line (no newline, bad JSON) is dropped;
/// a bad line elsewhere is an error.
pub fn read_file(path: &Path) -> io::Result<Vec<Event>> {
    let f = std::fs::File::open(path)?;
    let lines: Vec<String> = io::BufReader::new(f).lines().collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(lines.len());
    let n = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(e) => out.push(e),
            Err(_) if i + 1 == n => {}
            Err(e) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{}:{}: {e}", path.display(), i + 1)))
            }
        }
    }
    Ok(out)
}

/// Reads every `*.jsonl` file of `dir` and merges them by time (stable: ties
/// keep file order).
pub fn read_dir(dir: &Path) -> io::Result<Vec<Event>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut all = Vec::new();
    for f in files {
        all.extend(read_file(&f)?);
    }
    all.sort_by_key(|e| e.t);
    Ok(all)
}
