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

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Args;
use fencelock::{Acquire, Backend, Guard, LockOptions};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
};

use fencelock_server::config::parse_duration;

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
    let opts = a.lock.options(backend.capabilities().holder_identity).require_fencing(a.require_fencing);
    let guard = match acquire(&backend, &a.lock.name, &opts).await? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let mut child = match spawn(&a.cmd, &guard, &[]) {
        Ok(c) => c,
        Err(e) => {
            // Release now rather than leave the lock held until its TTL runs out.
            let _ = guard.release().await;
            return Err(anyhow::Error::new(e).context(format!("starting {:?}", a.cmd[0])));
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(-(id as i32)));
    supervise(&mut child, pgid, guard, a.kill_grace).await
}

/// Acquire with the given options; a contention outcome is an exit code.
async fn acquire(backend: &Backend, name: &str, opts: &LockOptions) -> anyhow::Result<Result<Guard, ExitCode>> {
    Ok(match backend.acquire(name, opts).await? {
        Acquire::Acquired(g) => Ok(g),
        Acquire::Busy { holder_lease, holder_token, reopens_in, .. } => {
            eprintln!("fencelock: lock {name:?} is busy{}", busy_detail(holder_lease, holder_token, reopens_in));
            Err(ExitCode::from(exit::BUSY))
        }
        Acquire::TimedOut => {
            eprintln!("fencelock: timed out after {:?} waiting for lock {name:?}", opts.wait);
            Err(ExitCode::from(exit::TIMED_OUT))
        }
    })
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
pub(crate) async fn supervise(
    child: &mut Child,
    pgid: Option<Pid>,
    guard: Guard,
    grace: Duration,
) -> anyhow::Result<ExitCode> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the child")?;
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

fn child_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => ExitCode::from(128u8.saturating_add(sig as u8)),
        _ => ExitCode::from(exit::ERROR),
    }
}
