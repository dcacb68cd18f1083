//! `fencelock run NAME -- CMD…`: run a command while holding a lock.
//!
//! Works with every backend (`--server` takes any backend URL: see
//! [`fencelock::backend`]). The lease is kept alive by the client's watchdog
//! while the child runs. The child gets `FENCELOCK_LOCK`, `FENCELOCK_TOKEN`,
//! `FENCELOCK_LEASE` and `FENCELOCK_BACKEND` in its environment (pass the token
//! to the resource it writes; it is empty where the backend gives none, and
//! `--require-fencing` refuses such a backend). If the lease is lost, the child's
//! process group gets SIGTERM, then SIGKILL after `--kill-grace`, and `run` exits
//! with [`exit::LEASE_LOST`]. If this process dies, the kernel kills the child
//! (parent-death signal), so a child never outlives the lease-keeping process.
//!
//! Descendants that leave the child's process group (a daemon that forks
//! twice, a `setsid`) are stopped too: `run` is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so an orphaned descendant becomes its child
//! rather than init's. When the lease is lost or the child exits, every
//! process descending from `run` (found through `/proc/*/stat`) gets SIGTERM,
//! what is left after `--kill-grace` gets SIGKILL, and `run` reaps them before
//! it releases the lock and exits (see [`stop`]).
//!
//! `--all a,b,c` takes every lock at once (an atomic multi-lock: all or none,
//! one token per lock, on one lease); the child then also gets
//! `FENCELOCK_TOKENS=a=12,b=13,c=14` (each lock with its token, in the order
//! named; split at `,`, then at the last `=`), and `FENCELOCK_LOCK` and
//! `FENCELOCK_TOKEN` are those of the first lock. Each resource checks the
//! token of its own lock.

use std::{
    collections::{HashMap, HashSet},
    process::ExitCode,
    time::Duration,
};

use anyhow::Context;
use clap::Args;
use fencelock::{Backend, Guard, LeaseLost, LockOptions, MultiGuard, Outcome};
use nix::{
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitPidFlag},
    },
    unistd::{getpid, Pid},
};
use tokio::{
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
};

use fencelock_http::parse_duration;

use crate::{exit, LockArgs, ServerArg};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    server: ServerArg,
    #[command(flatten)]
    lock: LockArgs,
    /// Refuse to run unless the backend gives a fencing token (Redlock and
    /// PostgreSQL advisory locks give none).
    #[arg(long)]
    require_fencing: bool,
    /// Run once per SLOT: `day` or `hour` (the current UTC day or hour), or
    /// any name (e.g. `2026-11-23`). When CMD exits, the server records the
    /// slot as done with CMD's exit code (whatever it is; not when the lease
    /// was lost); a later run for the same slot exits 76 at once, saying who
    /// ran it. The server remembers a slot 7 days. Without `--wait`, a run
    /// that comes while another runs is busy (73); with `--wait`, it queues,
    /// and when the run before it completes the slot it exits 76 at once
    /// (who ran it) without running CMD; if that run lost its lease instead,
    /// it runs when its turn comes. Only the fencelock
    /// backend.
    #[arg(long, value_name = "SLOT", conflicts_with = "all")]
    once_per: Option<String>,
    /// After SIGTERM, how long the child has to exit before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    kill_grace: Duration,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

pub async fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let backend =
        fencelock::connect(&a.server.url()).await.with_context(|| format!("connecting to {}", a.server.shown()))?;
    let result = hold_and_run(&backend, a).await;
    // The lease the locks were on lingers for a next acquire that this
    // process, about to exit, never makes: end it now, not a TTL from now.
    backend.close().await;
    result
}

async fn hold_and_run(backend: &Backend, a: RunArgs) -> anyhow::Result<ExitCode> {
    let opts = a.lock.options(backend.capabilities().holder_identity).require_fencing(a.require_fencing);
    let slot = a.once_per.as_deref().map(crate::slot::slot_now);
    let opts = match &slot {
        Some(s) => opts.once_per(s.as_str()),
        None => opts,
    };
    let held = match a.lock.all.as_slice() {
        [] => acquire(backend, a.lock.name(), &opts).await?.map(Holding::One),
        all => acquire_all(backend, all, &opts).await?.map(Holding::All),
    };
    let held = match held {
        Ok(h) => h,
        Err(code) => return Ok(code),
    };
    let tokens = held.tokens_env();
    let mut child = match spawn(&a.cmd, held.first(), &[("FENCELOCK_TOKENS", tokens.as_str())]) {
        Ok(c) => c,
        Err(e) => {
            // Release now rather than leave the lock held until its TTL runs out.
            let _ = held.release().await;
            return Err(anyhow::Error::new(e).context(format!("starting {:?}", a.cmd[0])));
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(-(id as i32)));
    supervise(&mut child, pgid, held, a.kill_grace, slot.as_deref()).await
}

/// What `run` holds while its child runs: one lock, or every lock of `--all`.
pub(crate) enum Holding {
    One(Guard),
    All(MultiGuard),
}

impl Holding {
    /// The (first) lock's guard: its name and token are `FENCELOCK_LOCK` and
    /// `FENCELOCK_TOKEN`.
    fn first(&self) -> &Guard {
        match self {
            Holding::One(g) => g,
            Holding::All(m) => &m.guards()[0],
        }
    }

    /// `FENCELOCK_TOKENS`: `lock=token` of every lock, comma-separated, in order.
    fn tokens_env(&self) -> String {
        let guards = match self {
            Holding::One(g) => std::slice::from_ref(g),
            Holding::All(m) => m.guards(),
        };
        let each =
            guards.iter().map(|g| format!("{}={}", g.name(), g.token().map(|t| t.to_string()).unwrap_or_default()));
        each.collect::<Vec<_>>().join(",")
    }

    async fn lost(&self) -> LeaseLost {
        match self {
            Holding::One(g) => g.lost().await,
            Holding::All(m) => m.lost().await,
        }
    }

    async fn release(self) -> Result<bool, fencelock::Error> {
        match self {
            Holding::One(g) => g.release().await,
            Holding::All(m) => m.release().await,
        }
    }
}

/// Take every lock of `names` at once; a contention outcome is an exit code.
async fn acquire_all(
    backend: &Backend,
    names: &[String],
    opts: &LockOptions,
) -> anyhow::Result<Result<MultiGuard, ExitCode>> {
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let outcome = backend.acquire_all(&refs, opts).await?;
    Ok(granted_or_exit(outcome, &names.join(","), opts))
}

/// Acquire with the given options; a contention outcome is an exit code.
async fn acquire(backend: &Backend, name: &str, opts: &LockOptions) -> anyhow::Result<Result<Guard, ExitCode>> {
    let outcome = match backend.acquire(name, opts).await {
        Err(fencelock::Error::SlotDone { token, identity, exit_code }) => {
            let who = if identity.is_empty() { "an unnamed holder".to_string() } else { identity };
            let slot = &opts.once_per;
            eprintln!(
                "fencelock: slot {slot:?} of lock {name:?} already ran: by {who} (token {token}, exit {exit_code})"
            );
            return Ok(Err(ExitCode::from(exit::SLOT_DONE)));
        }
        other => other?,
    };
    Ok(granted_or_exit(outcome, name, opts))
}

/// The grant, or the exit code of a contention outcome (said on stderr).
fn granted_or_exit<G>(outcome: Outcome<G>, name: &str, opts: &LockOptions) -> Result<G, ExitCode> {
    match outcome {
        Outcome::Acquired(g) => Ok(g),
        Outcome::Busy { holder_lease, holder_token, reopens_in, .. } => {
            eprintln!("fencelock: lock {name:?} is busy{}", busy_detail(holder_lease, holder_token, reopens_in));
            Err(ExitCode::from(exit::BUSY))
        }
        Outcome::TimedOut => {
            eprintln!("fencelock: timed out after {:?} waiting for lock {name:?}", opts.wait);
            Err(ExitCode::from(exit::TIMED_OUT))
        }
    }
}

pub fn busy_detail(lease: Option<u64>, token: Option<u64>, reopens_in: Option<Duration>) -> String {
    match (lease, token, reopens_in) {
        (Some(l), Some(t), _) => format!(" (held by lease {l} with token {t})"),
        (None, Some(t), _) => format!(" (held with token {t})"),
        (_, _, Some(d)) => format!(" (closed by a lock-delay or hold-at-least for another {d:?})"),
        _ => String::new(),
    }
}

/// Starts `cmd` in its own process group with the grant's `FENCELOCK_*`
/// variables and `extra_env`, killed if this process dies. Makes this process
/// a child subreaper first, so that the descendants `cmd` orphans (a daemon, a
/// `setsid`) become children of this process, which [`stop`] ends and reaps.
pub(crate) fn spawn(cmd: &[String], guard: &Guard, extra_env: &[(&str, &str)]) -> std::io::Result<Child> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
    let mut c = Command::new(&cmd[0]);
    c.envs(extra_env.iter().copied());
    c.args(&cmd[1..])
        .env("FENCELOCK_LOCK", guard.name())
        .env("FENCELOCK_TOKEN", guard.token().map(|t| t.to_string()).unwrap_or_default())
        .env("FENCELOCK_LEASE", guard.lease_id().to_string())
        .env("FENCELOCK_BACKEND", guard.backend())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe {
        c.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
    c.spawn()
}

/// Wait for the child while watching the lease; forward SIGTERM/SIGINT/SIGHUP.
/// `slot`: when the child exits (the lease still held), record it done with
/// the child's exit code before releasing.
pub(crate) async fn supervise(
    child: &mut Child,
    pgid: Option<Pid>,
    guard: Holding,
    grace: Duration,
    slot: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the child")?;
                // What the child left running stops before the lock is released.
                let all = descendants();
                reap_orphans(&all, child.id());
                let left = live(&all);
                if !left.is_empty() {
                    eprintln!("fencelock: the command exited; stopping the {} process(es) it left running", left.len());
                    stop(child, pgid, grace).await;
                }
                if let Some(slot) = slot {
                    complete(guard.first(), slot, status_code(status)).await;
                }
                if let Err(e) = guard.release().await {
                    eprintln!("fencelock: warning: could not release the lock (its lease will expire): {e}");
                }
                return Ok(child_code(status));
            }
            reason = guard.lost() => {
                eprintln!("fencelock: lease lost ({reason}); stopping the command");
                stop(child, pgid, grace).await;
                return Ok(ExitCode::from(exit::LEASE_LOST));
            }
            _ = term.recv() => forward(pgid, Signal::SIGTERM),
            _ = int.recv() => forward(pgid, Signal::SIGINT),
            _ = hup.recv() => forward(pgid, Signal::SIGHUP),
        }
    }
}

fn forward(pgid: Option<Pid>, sig: Signal) {
    if let Some(p) = pgid {
        let _ = kill(p, sig);
    }
}

/// How often [`stop`] looks whether everything it signalled has exited.
const STOP_POLL: Duration = Duration::from_millis(20);
/// How many polls [`stop`] waits, after SIGKILL, for descendants to exit
/// (10 s) before it says which remain and goes on.
const KILL_POLLS: u32 = 500;

/// Ends the command and everything it started: SIGTERM to the child's group
/// (while the child has not been waited for) and to every descendant of this
/// process, then, after `grace`, SIGKILL to what is left (again until none
/// is left); reaps the descendants that became this process's children.
/// The child itself is only ever waited for through `child` (tokio's), never
/// by pid here: see [`reap_orphans`].
async fn stop(child: &mut Child, pgid: Option<Pid>, grace: Duration) {
    // The group's id is the child's pid: signal it only while the child is
    // not waited for (its pid, and so the group's id, cannot be reused yet).
    let group = |c: &Child| pgid.filter(|_| c.id().is_some());
    forward(group(child), Signal::SIGTERM);
    signal_each(&live(&descendants()), Signal::SIGTERM);
    if tokio::time::timeout(grace, async {
        while !ended(child) {
            tokio::time::sleep(STOP_POLL).await;
        }
    })
    .await
    .is_ok()
    {
        return;
    }
    eprintln!("fencelock: the command or a process it started did not exit within {grace:?}; sending SIGKILL");
    for _ in 0..KILL_POLLS {
        forward(group(child), Signal::SIGKILL);
        signal_each(&live(&descendants()), Signal::SIGKILL);
        tokio::time::sleep(STOP_POLL).await;
        if ended(child) {
            return;
        }
    }
    let left = live(&descendants());
    eprintln!("fencelock: warning: processes still running after SIGKILL: {left:?}");
    let _ = child.wait().await;
}

/// Whether the child has exited and no descendant of this process is left
/// running; reaps the child (through tokio) and the orphans that exited.
fn ended(child: &mut Child) -> bool {
    let child_done = !matches!(child.try_wait(), Ok(None));
    let all = descendants();
    reap_orphans(&all, child.id());
    child_done && live(&all).is_empty()
}

/// A process descending from this one, as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy)]
struct Descendant {
    pid: Pid,
    parent: Pid,
    /// Exited, not yet waited for by its parent.
    zombie: bool,
}

/// Every process whose chain of parents leads to this process, from one
/// reading of `/proc/*/stat`; none if `/proc` cannot be read.
fn descendants() -> Vec<Descendant> {
    let me = getpid();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut children: HashMap<Pid, Vec<Descendant>> = HashMap::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        // Gone since the listing, or not ours to read: either way not a descendant we can end.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some((state, parent)) = parse_stat(&stat) {
            let d = Descendant { pid: Pid::from_raw(pid), parent, zombie: state == 'Z' };
            children.entry(parent).or_default().push(d);
        }
    }
    // Walk down from this process; `seen` guards against a cycle that a
    // reading made while processes come and go could in theory show.
    let (mut out, mut seen, mut next) = (Vec::new(), HashSet::from([me]), vec![me]);
    while let Some(parent) = next.pop() {
        for d in children.remove(&parent).unwrap_or_default() {
            if seen.insert(d.pid) {
                next.push(d.pid);
                out.push(d);
            }
        }
    }
    out
}

/// The state and the parent's pid of a `/proc/PID/stat` line: `PID (COMM)
/// STATE PPID …`, where COMM may hold spaces and parentheses.
fn parse_stat(stat: &str) -> Option<(char, Pid)> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, Pid::from_raw(parent)))
}

/// The pids of `all` that have not exited.
fn live(all: &[Descendant]) -> Vec<Pid> {
    all.iter().filter(|d| !d.zombie).map(|d| d.pid).collect()
}

fn signal_each(pids: &[Pid], sig: Signal) {
    for &p in pids {
        let _ = kill(p, sig);
    }
}

/// Waits for (reaps) each exited process of `all` that is a child of this
/// process (an orphan re-parented here), by its pid and without blocking:
/// never `waitpid(-1)`, and never the pid `main` of the child tokio waits for
/// (`Child::id`, `None` once tokio has waited for it), so its exit status is
/// tokio's alone.
fn reap_orphans(all: &[Descendant], main: Option<u32>) {
    let me = getpid();
    for d in all.iter().filter(|d| d.zombie && d.parent == me) {
        if main.is_some_and(|m| m as i32 == d.pid.as_raw()) {
            continue;
        }
        let _ = waitpid(d.pid, Some(WaitPidFlag::WNOHANG));
    }
}

/// Record `slot` done under `guard` with `code`; a failure is reported, not
/// fatal (the next run of the slot then runs again).
async fn complete(guard: &Guard, slot: &str, code: i32) {
    match guard.complete_slot(slot, code).await {
        Ok(true) => {}
        Ok(false) => eprintln!("fencelock: warning: the lock was lost: slot {slot:?} is not recorded as done"),
        Err(e) => eprintln!("fencelock: warning: could not record slot {slot:?} as done: {e}"),
    }
}

/// The child's exit code as a shell reports it (128+N if it died of signal N).
fn status_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => i32::from(exit::ERROR),
    }
}

fn child_code(status: std::process::ExitStatus) -> ExitCode {
    ExitCode::from(u8::try_from(status_code(status)).unwrap_or(exit::ERROR))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's name may hold spaces and parentheses: the state and the
    /// parent's pid are read after the last `)`.
    #[test]
    fn stat_lines_are_read_after_the_name() {
        assert_eq!(parse_stat("42 (sleep) S 7 42 42 0"), Some(('S', Pid::from_raw(7))));
        assert_eq!(parse_stat("43 (a) Z (b) Z 1 43 43 0"), Some(('Z', Pid::from_raw(1))));
        assert_eq!(parse_stat("44 (cut"), None);
    }

    /// This process's own children are found as its descendants, and
    /// nothing else is (not this process, not its parent).
    #[test]
    fn descendants_are_found_through_proc() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let found = descendants();
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.iter().any(|d| d.pid == pid && d.parent == getpid()), "{found:?}");
        assert!(found.iter().all(|d| d.pid != getpid() && d.pid != nix::unistd::getppid()), "{found:?}");
    }
}
