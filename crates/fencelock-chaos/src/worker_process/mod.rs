//! One worker process (run by `fencelock-chaos worker`; the harness drives
//! it through `worker_control`): it loops acquire → fenced read of the
//! object → append its own unique id → fenced write with its token →
//! release, and writes every step to its history file. The harness runs
//! several, each in its own process, so that a SIGSTOP pauses exactly one
//! holder (its keep-alives too).
//!
//! Control (one line per command on stdin): `pause-next` — at the next write,
//! after the last check of the lease, stop this process with SIGSTOP (the
//! harness sends SIGCONT later: the Kleppmann pause); `hold-next` — at the next
//! write, print `at-write <seq>` and wait for `go` (the harness holds the
//! network meanwhile); `slow-next <ms>` — at the next write, *before* the last
//! check, print `slowing <seq>`, take `<ms>` by this process's own clock (K3:
//! a clock that may run slow), then print `slowed <seq> <own ms> <real ms>`;
//! `cancel` — forget a pending `pause-next`/`hold-next`/`slow-next`; `stop` —
//! finish the current cycle and exit.
//! Reports (stdout): `ready`, `pausing <seq>`, `at-write <seq>`, `slowing
//! <seq>`, `slowed <seq> <own ms> <real ms>`.
//!
//! Election mode (`--election`, leader election of issue 17): the cycle
//! campaigns for the lock as an election instead (value `<worker>-<seq>`),
//! and as leader reads and writes with its term as the token, holds, then
//! resigns (`campaign`, `resign` in the history). The control lines act the
//! same, so K1 pauses a leader at its write.
//!
//! Shared mode (`--shared`, read-write locks of issue 18): each cycle the
//! worker is a reader with probability [`READ_SHARE`] — a shared acquire
//! (`shared` in the history), one fenced read with its token, hold, release —
//! or else a writer, the cycle above under an exclusive acquire. A reader's
//! read is its fenced operation: the control lines act there as at a write
//! (its last check, then `pause-next`/`hold-next`, which prints `at-write
//! <seq>` for a read too), and its `read` is invoked once they are past, when
//! the request leaves.
//!
//! Semaphore mode (`--permits N`, issue 18): every acquire takes one permit
//! of the semaphore of N permits, and the worker's object is its own (the
//! harness gives each worker its key), so that the holders' writes never
//! race.
//!
//! Multi mode (`--multi K`, atomic multi-locks of issue 18): locks
//! `<lock>-m0`…`<lock>-m<K-1>`, each guarding its own object `<key>-m<i>`.
//! Each cycle the worker takes, with probability one half, all K locks at
//! once (`acquire_all`, in an order it shuffles each cycle: crossed orders
//! between workers, the deadlock case) or else one of them (a plain
//! acquire), then reads and writes the object of each lock it holds with
//! that lock's token (see `multi`). The control lines act at the cycle's
//! first write, so K1 stops a multi-holder with all its locks.
//!
//! Every choice (reader or writer, one lock or all, the order, the hold) is
//! drawn from a seeded generator: `--seed` (the run's) and the worker's id.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fencelock::backend::{Backend, Guard};
use fencelock::{Error, LockOptions, Outcome};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use crate::history::{mono_ns, Event, Kind, Op, Writer};
use crate::http;

mod multi;

/// The storage's fencing headers, as `fencelock_fence::storage` names them.
const LOCK_HEADER: &str = "Fencing-Lock";
const TOKEN_HEADER: &str = "Fencing-Token";
/// The token a worker sends when its backend gives none: the storage then
/// admits every write (equal tokens are admitted), which is what "no fencing"
/// means for the resource.
pub const NO_TOKEN: u64 = 1;
/// Longer than any hold the nemesis applies (5 × TTL ≤ 5 × 2 s): a held write
/// must arrive late, not be abandoned by the worker.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Shared mode: the share of cycles in which a worker is a reader.
pub const READ_SHARE: f64 = 0.7;

#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    #[arg(long)]
    pub id: u32,
    /// The lock service, as `fencelock::backend::connect` takes it.
    #[arg(long)]
    pub lock_url: String,
    /// The fenced storage server (or this worker's proxy to it).
    #[arg(long)]
    pub storage: SocketAddr,
    #[arg(long)]
    pub lock: String,
    #[arg(long)]
    pub key: String,
    #[arg(long)]
    pub ttl_ms: u64,
    #[arg(long)]
    pub wait_ms: u64,
    #[arg(long)]
    pub history: PathBuf,
    /// After its write a worker keeps the lock for a random 0..hold_ms, as a
    /// job does (and so that a kill often finds a holder).
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// Campaign for `lock` as an election and resign, instead of acquire and release.
    #[arg(long)]
    pub election: bool,
    /// Shared mode: a reader (shared acquire, fenced read) with probability
    /// `READ_SHARE` each cycle, else a writer.
    #[arg(long, conflicts_with = "election")]
    pub shared: bool,
    /// Semaphore mode: take one permit of a semaphore of this many (0: a lock).
    #[arg(long, default_value_t = 0)]
    pub permits: u32,
    /// Multi mode: this many locks `<lock>-m<i>`, each guarding object
    /// `<key>-m<i>`; a cycle takes all of them at once or one (0: off).
    #[arg(long, default_value_t = 0, conflicts_with_all = ["election", "shared", "permits"])]
    pub multi: u32,
    /// The run's seed: with the worker's id, it seeds every choice of the worker.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The mutant reads-unfenced: reads leave without the fencing headers.
    #[arg(long, hide = true)]
    pub unfenced_reads: bool,
    /// The mutant multi-one-by-one: a multi-acquire takes its locks one
    /// after another with plain acquires and records them as one grant.
    #[arg(long, hide = true)]
    pub multi_one_by_one: bool,
}

/// A lock and the object it guards (the fence's `Fencing-Lock` and key).
#[derive(Debug, Clone)]
struct Guarded {
    lock: String,
    key: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctl {
    PauseNext,
    HoldNext,
    SlowNext(u64),
    Go,
    Cancel,
    Stop,
}

struct Worker {
    a: WorkerArgs,
    p: String,
    out: Writer,
    backend: Backend,
    ctl: mpsc::UnboundedReceiver<Ctl>,
    pending: Option<Ctl>,
    stopping: bool,
    /// Every choice of the worker, seeded from the run's seed and its id.
    rng: fastrand::Rng,
}

/// The worker's generator: the run's seed mixed with the worker's id.
fn worker_rng(seed: u64, id: u32) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The worker's main: connects, then cycles until told to stop.
pub async fn run(a: WorkerArgs) -> anyhow::Result<()> {
    let out = Writer::create(&a.history).with_context(|| format!("history {}", a.history.display()))?;
    let backend = connect(&a.lock_url).await?;
    let (tx, ctl) = mpsc::unbounded_channel();
    tokio::spawn(read_control(tx));
    let p = format!("w{}", a.id);
    let rng = worker_rng(a.seed, a.id);
    let mut w = Worker { a, p, out, backend, ctl, pending: None, stopping: false, rng };
    say("ready");
    let mut seq = 0;
    while !w.stopping {
        w.drain_control();
        if w.stopping {
            break;
        }
        seq += 1;
        match w.a.multi {
            0 => w.cycle(seq).await?,
            _ => w.multi_cycle(seq).await?,
        }
    }
    Ok(())
}

/// Connects, retrying for up to 30 s (the service may be restarting).
async fn connect(url: &str) -> anyhow::Result<Backend> {
    let mut last = None;
    for _ in 0..300 {
        match fencelock::backend::connect(url).await {
            Ok(b) => return Ok(b),
            Err(e @ (Error::InvalidArgument(_) | Error::Unsupported(_))) => return Err(e.into()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow::anyhow!("cannot connect to {url}: {}", last.map(|e| e.to_string()).unwrap_or_default()))
}

async fn read_control(tx: mpsc::UnboundedSender<Ctl>) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let c = match line.trim() {
            "pause-next" => Ctl::PauseNext,
            "hold-next" => Ctl::HoldNext,
            "go" => Ctl::Go,
            "cancel" => Ctl::Cancel,
            "stop" => Ctl::Stop,
            l => match l.strip_prefix("slow-next ").and_then(|ms| ms.parse().ok()) {
                Some(ms) => Ctl::SlowNext(ms),
                None => continue,
            },
        };
        if tx.send(c).is_err() {
            return;
        }
    }
    // The harness is gone: stop.
    let _ = tx.send(Ctl::Stop);
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

impl Worker {
    fn drain_control(&mut self) {
        while let Ok(c) = self.ctl.try_recv() {
            self.take(c);
        }
    }

    fn take(&mut self, c: Ctl) {
        match c {
            Ctl::Stop => self.stopping = true,
            Ctl::PauseNext | Ctl::HoldNext | Ctl::SlowNext(_) => self.pending = Some(c),
            Ctl::Cancel => self.pending = None,
            Ctl::Go => {}
        }
    }

    fn log(&mut self, e: Event) -> anyhow::Result<()> {
        self.out.write(&e).context("write history")
    }

    fn ev(&self, kind: Kind, f: Op, seq: u64) -> Event {
        Event { seq, ..Event::new(mono_ns(), self.p.clone(), kind, f) }
    }

    /// One acquire → read → write → release cycle (election mode: campaign →
    /// read → write → resign; shared mode, as a reader: shared acquire → read
    /// → release).
    async fn cycle(&mut self, seq: u64) -> anyhow::Result<()> {
        let reader = self.a.shared && self.rng.f64() < READ_SHARE;
        let granted = match self.a.election {
            true => self.campaign(seq).await?,
            false => self.acquire(seq, reader).await?,
        };
        let Some(guard) = granted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Ok(());
        };
        let token = guard.token().unwrap_or(NO_TOKEN);
        let obj = Guarded { lock: self.a.lock.clone(), key: self.a.key.clone() };
        if reader {
            self.reader_read(seq, token, &guard, &obj).await?;
        } else if let Some(value) = self.read(seq, token, &obj).await? {
            self.write(seq, token, &guard, value, &obj).await?;
        }
        self.hold().await;
        self.release(seq, token, guard).await
    }

    /// After its writes a holder keeps its locks for a random `0..hold_ms`.
    async fn hold(&mut self) {
        if self.a.hold_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.rng.u64(0..self.a.hold_ms))).await;
        }
    }

    /// The options of every acquire: the TTL, the wait, and the mode's.
    fn options(&self, shared: bool) -> LockOptions {
        let mut opts = LockOptions::default()
            .ttl(Duration::from_millis(self.a.ttl_ms))
            .wait(Duration::from_millis(self.a.wait_ms));
        if shared {
            opts = opts.shared();
        }
        if self.a.permits > 0 {
            opts = opts.permits(self.a.permits);
        }
        opts
    }

    /// Acquires the lock, as a reader (shared) if `shared`.
    async fn acquire(&mut self, seq: u64, shared: bool) -> anyhow::Result<Option<Guard>> {
        self.log(Event { shared, ..self.ev(Kind::Invoke, Op::Acquire, seq) })?;
        let opts = self.options(shared);
        let res = self.backend.acquire(&self.a.lock, &opts).await;
        let mut e = Event { shared, ..self.ev(Kind::Ok, Op::Acquire, seq) };
        let guard = match res {
            Ok(Outcome::Acquired(g)) => {
                e.token = g.token();
                e.lease = Some(g.lease_id());
                e.detail = lease_left(&g);
                Some(g)
            }
            Ok(Outcome::Busy { .. }) => fail(&mut e, "busy"),
            Ok(Outcome::TimedOut) => fail(&mut e, "timed out"),
            Err(err) => self.failed(&mut e, err),
        };
        self.log(e)?;
        Ok(guard)
    }

    /// Campaigns for the election `lock` for up to `wait_ms` (then withdraws:
    /// `unknown`, it may have been elected meanwhile); the leadership's guard.
    async fn campaign(&mut self, seq: u64) -> anyhow::Result<Option<Guard>> {
        self.log(self.ev(Kind::Invoke, Op::Campaign, seq))?;
        let election = self
            .backend
            .election(&self.a.lock)
            .ttl(Duration::from_millis(self.a.ttl_ms))
            .value(format!("{}-{seq}", self.p));
        let res = tokio::time::timeout(Duration::from_millis(self.a.wait_ms), election.campaign()).await;
        let mut e = self.ev(Kind::Ok, Op::Campaign, seq);
        let guard = match res {
            Ok(Ok(leadership)) => {
                e.token = Some(leadership.term());
                e.lease = Some(leadership.guard().lease_id());
                e.detail = lease_left(leadership.guard());
                Some(leadership.into_guard())
            }
            Ok(Err(err)) => self.failed(&mut e, err),
            Err(_) => unknown(&mut e, "not elected within the wait; withdrawn"),
        };
        self.log(e)?;
        Ok(guard)
    }

    /// Fills `e` in for a lock service error: `fail` if it certainly did not
    /// take effect, else `unknown`.
    fn failed<T>(&self, e: &mut Event, err: Error) -> Option<T> {
        e.kind = if definite(&err) { Kind::Fail } else { Kind::Unknown };
        e.refused = refused(&err);
        e.error = Some(err.to_string());
        None
    }

    /// A reader's read: the fault points and the last check as before a
    /// write, then the fenced read (or a `read` failed as `skipped`).
    async fn reader_read(&mut self, seq: u64, token: u64, guard: &Guard, obj: &Guarded) -> anyhow::Result<()> {
        self.slow_point(seq).await;
        if lease_gone(guard) {
            let invoke =
                Event { token: Some(token), key: Some(obj.key.clone()), ..self.ev(Kind::Invoke, Op::Read, seq) };
            self.log(invoke.clone())?;
            let why = Some("lease lost before the read".into());
            return self.log(Event { kind: Kind::Fail, t: mono_ns(), skipped: true, error: why, ..invoke });
        }
        self.fault_point(seq).await;
        self.read(seq, token, obj).await.map(|_| ())
    }

    /// A fenced read; `None` (after logging why) unless it succeeded.
    async fn read(&mut self, seq: u64, token: u64, obj: &Guarded) -> anyhow::Result<Option<Vec<String>>> {
        let key = Some(obj.key.clone());
        self.log(Event { token: Some(token), key: key.clone(), ..self.ev(Kind::Invoke, Op::Read, seq) })?;
        let path = format!("/objects/{}", obj.key);
        let headers = if self.a.unfenced_reads { Vec::new() } else { fencing(obj, token) };
        let res = http::request(self.a.storage, "GET", &path, &headers, b"", READ_TIMEOUT).await;
        let mut e = Event { token: Some(token), key, ..self.ev(Kind::Ok, Op::Read, seq) };
        let value = match res {
            Ok(r) if r.status == 200 => Some(entries(&r.body)),
            Ok(r) if r.status == 404 => Some(Vec::new()),
            Ok(r) if r.status == 409 => {
                e.stale = true;
                fail(&mut e, &r.text())
            }
            Ok(r) if r.status < 500 => fail(&mut e, &format!("{}: {}", r.status, r.text())),
            Ok(r) => unknown(&mut e, &format!("{}: {}", r.status, r.text())),
            Err(err) => unknown(&mut e, &err.to_string()),
        };
        e.value.clone_from(&value);
        self.log(e)?;
        Ok(value)
    }

    async fn write(
        &mut self,
        seq: u64,
        token: u64,
        guard: &Guard,
        mut value: Vec<String>,
        obj: &Guarded,
    ) -> anyhow::Result<()> {
        let id = format!("{}-{seq}", self.p);
        let invoke = Event {
            token: Some(token),
            key: Some(obj.key.clone()),
            append: Some(id.clone()),
            ..self.ev(Kind::Invoke, Op::Write, seq)
        };
        self.log(invoke.clone())?;
        self.slow_point(seq).await;
        // The last check: never write once the guard says the lease may be gone.
        if lease_gone(guard) {
            let e = Event {
                kind: Kind::Fail,
                t: mono_ns(),
                skipped: true,
                error: Some("lease lost before the write".into()),
                ..invoke
            };
            return self.log(e);
        }
        self.fault_point(seq).await;
        value.push(id);
        let body = value.join("\n");
        let path = format!("/objects/{}", obj.key);
        let res =
            http::request(self.a.storage, "PUT", &path, &fencing(obj, token), body.as_bytes(), WRITE_TIMEOUT).await;
        let mut e = Event { kind: Kind::Ok, t: mono_ns(), ..invoke };
        match res {
            Ok(r) if r.status == 200 || r.status == 201 => {}
            Ok(r) if r.status == 409 => {
                e.stale = true;
                fail::<()>(&mut e, &r.text());
            }
            Ok(r) if r.status < 500 => {
                fail::<()>(&mut e, &format!("{}: {}", r.status, r.text()));
            }
            Ok(r) => {
                unknown::<()>(&mut e, &format!("{}: {}", r.status, r.text()));
            }
            Err(err) => {
                unknown::<()>(&mut e, &err.to_string());
            }
        }
        self.log(e)
    }

    /// Where a pending `slow-next` takes effect: before the last check, so
    /// that the check judges the lease by this process's own clock.
    async fn slow_point(&mut self, seq: u64) {
        let Some(Ctl::SlowNext(ms)) = self.pending else { return };
        self.pending = None;
        say(&format!("slowing {seq}"));
        let (own, real) = (tokio::time::Instant::now(), mono_ns());
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let real_ms = (mono_ns() - real) / 1_000_000;
        say(&format!("slowed {seq} {} {real_ms}", own.elapsed().as_millis()));
    }

    /// Where a pending `pause-next` or `hold-next` takes effect: after the
    /// last check, before the write leaves.
    async fn fault_point(&mut self, seq: u64) {
        match self.pending.take() {
            Some(Ctl::PauseNext) => {
                say(&format!("pausing {seq}"));
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
            }
            Some(Ctl::HoldNext) => {
                say(&format!("at-write {seq}"));
                let wait = tokio::time::timeout(Duration::from_secs(10), async {
                    while let Some(c) = self.ctl.recv().await {
                        if c == Ctl::Go {
                            return;
                        }
                        self.take(c);
                    }
                });
                let _ = wait.await;
            }
            _ => {}
        }
    }

    /// Releases the lock (election mode: resigns, the same call on the leadership's guard).
    async fn release(&mut self, seq: u64, token: u64, guard: Guard) -> anyhow::Result<()> {
        let op = if self.a.election { Op::Resign } else { Op::Release };
        self.log(Event { token: Some(token), ..self.ev(Kind::Invoke, op, seq) })?;
        let res = guard.release().await;
        let mut e = Event { token: Some(token), ..self.ev(Kind::Ok, op, seq) };
        released(&mut e, res);
        self.log(e)
    }
}

/// Fills a release's completion `e` in from its outcome.
fn released(e: &mut Event, res: Result<bool, Error>) {
    match res {
        Ok(released) => e.released = Some(released),
        Err(err) if refused(&err) => {
            e.refused = true;
            fail::<()>(e, &err.to_string());
        }
        Err(err) => {
            unknown::<()>(e, &err.to_string());
        }
    }
}

/// The fencing headers of an operation on `obj`'s object with `token`.
fn fencing(obj: &Guarded, token: u64) -> Vec<(&'static str, String)> {
    vec![(LOCK_HEADER, obj.lock.clone()), (TOKEN_HEADER, token.to_string())]
}

/// A grant's `detail`: how long its lease has left by the guard's own
/// deadline, as `lease_left_ns` (C6 does not expect a restart to keep a lease
/// its holder already counts as possibly gone).
fn lease_left(guard: &Guard) -> serde_json::Value {
    let left = guard.deadline().saturating_duration_since(tokio::time::Instant::now());
    serde_json::json!({ "lease_left_ns": left.as_nanos() as u64 })
}

/// The last check before a fenced operation: the guard says the lease may be gone.
fn lease_gone(guard: &Guard) -> bool {
    guard.is_lost() || tokio::time::Instant::now() >= guard.deadline()
}

/// Errors after which the request certainly did not take effect.
fn definite(e: &Error) -> bool {
    refused(e) || matches!(e, Error::InvalidArgument(_) | Error::Unsupported(_) | Error::Connect { .. })
}

/// The service refused the worker's credentials: decided before anything is
/// written, never retried.
fn refused(e: &Error) -> bool {
    matches!(e, Error::Unauthenticated(_) | Error::PermissionDenied(_))
}

fn fail<T>(e: &mut Event, why: &str) -> Option<T> {
    e.kind = Kind::Fail;
    e.error = Some(why.to_string());
    None
}

fn unknown<T>(e: &mut Event, why: &str) -> Option<T> {
    e.kind = Kind::Unknown;
    e.error = Some(why.to_string());
    None
}

/// The object's entries: one id per line.
pub fn entries(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}
