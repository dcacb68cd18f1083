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
//! `--all a,b,c` takes every lock at once (an atomic multi-lock: all or none,
//! one token per lock, on one lease); the child then also gets
//! `FENCELOCK_TOKENS=a=12,b=13,c=14` (each lock with its token, in the order
//! named; split at `,`, then at the last `=`), and `FENCELOCK_LOCK` and
//! `FENCELOCK_TOKEN` are those of the first lock. Each resource checks the
//! token of its own lock.

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Args;
use fencelock::{Backend, Guard, LeaseLost, LockOptions, MultiGuard, Outcome};
use nix::{sys::signal::Signal, unistd::Pid};
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
/// variables and `extra_env`, killed if this process dies.
pub(crate) fn spawn(cmd: &[String], guard: &Guard, extra_env: &[(&str, &str)]) -> std::io::Result<Child> {
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
        let _ = nix::sys::signal::kill(p, sig);
    }
}

/// SIGTERM the child's group, then SIGKILL after `grace`.
async fn stop(child: &mut Child, pgid: Option<Pid>, grace: Duration) {
    forward(pgid, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!("fencelock: the command did not exit within {grace:?}; sending SIGKILL");
        forward(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
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
