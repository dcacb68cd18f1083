//! W4 durability (native server): fsyncs per acknowledged operation, and a
//! SIGKILL + restart that must find every acknowledged grant.
//!
//! Where it sits: `main` calls [`run`] once, on a fresh [`NativeServer`].
//!
//! 1. **fsyncs.** `strace -f -c` is attached to the server process (every
//!    thread, and threads it starts later) and counts `fsync`, `fdatasync`,
//!    `sync_file_range` and `syncfs`. Meanwhile `clients` clients, each with a
//!    session of its own and its own lock, grant a lease, then loop acquire →
//!    release, renewing the lease every TTL/3 between cycles. Every operation
//!    they see acknowledged is counted here, by kind; the clients stop before
//!    strace is detached, so every fsync of their operations is counted and no
//!    operation is counted without its fsyncs. The server's own log counters
//!    (`/metrics`) give the entries written, hence fsyncs per log entry. strace
//!    stops the server at every system call it makes (not only the counted
//!    ones), so the server runs slower while attached: throughput here is not a
//!    figure, and a slower server gathers more commands per entry.
//! 2. **Durability.** Each client then takes a second lock and keeps it (its
//!    acknowledged token recorded), while as many other clients loop acquire →
//!    release on locks of their own; with that load still running the server is
//!    SIGKILLed and restarted on the same data. Every kept grant must still hold
//!    its lock with the same lease and token, and the first token granted after
//!    the restart must exceed every token acknowledged before the kill.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context};
use fencelock::{Client, Outcome, Session};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    sync::watch,
    task::JoinSet,
    time::Instant,
};

use crate::{admin::wait_ready, engines::NativeServer, model::Durability, scale::ServerCounters};

/// TTL of the clients' leases (renewed every TTL/3).
const TTL: Duration = Duration::from_secs(10);
/// The system calls counted as fsyncs.
const SYNC_CALLS: &str = "trace=fsync,fdatasync,sync_file_range,syncfs";

/// Acknowledged operations, by kind.
#[derive(Default)]
struct Counts {
    lease_grants: AtomicU64,
    grants: AtomicU64,
    releases: AtomicU64,
    keep_alives: AtomicU64,
    errors: AtomicU64,
    /// Highest fencing token acknowledged to any client.
    max_token: AtomicU64,
    /// Print the first error (not for the load that the kill is meant to break).
    loud: bool,
}

impl Counts {
    fn ops(&self) -> u64 {
        let kinds = [&self.lease_grants, &self.grants, &self.releases, &self.keep_alives];
        kinds.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn error(&self, what: &str, e: &dyn std::fmt::Display) {
        if self.errors.fetch_add(1, Ordering::Relaxed) == 0 && self.loud {
            eprintln!("W4: {what}: {e}");
        }
    }
}

/// W4 with `clients` clients cycling for `measure` under strace, then the kill.
pub async fn run(native: &mut NativeServer, clients: usize, measure: Duration) -> anyhow::Result<Durability> {
    let clients = clients.max(1);
    wait_ready(native.http_addr(), Duration::from_secs(30)).await?;
    let sessions = open_sessions(&native.url(), clients).await?;

    // 1. fsyncs per acknowledged operation.
    let strace = Strace::attach(native.pid()).await?;
    let before = ServerCounters::read(native.http_addr()).await?;
    let counts = Arc::new(Counts { loud: true, ..Counts::default() });
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (i, s) in sessions.iter().enumerate() {
        let (s, counts, stopped) = (s.clone(), counts.clone(), stopped.clone());
        tasks.spawn(async move { cycle(&s, &format!("w4/c{i}"), &counts, stopped).await });
    }
    tokio::time::sleep(measure).await;
    let _ = stop.send(true);
    let mut leases = Vec::new();
    while let Some(r) = tasks.join_next().await {
        leases.push(r??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = ServerCounters::read(native.http_addr()).await?;
    let (fsyncs, detail) = strace.detach().await?;
    let ops = counts.ops();
    let (log_entries, log_commands) = (after.entries - before.entries, after.commands - before.commands);
    eprintln!("W4: {fsyncs} syncs ({detail}), {ops} acknowledged ops, {log_entries} log entries");

    // 2. Keep one grant per client, kill the server under load, look for them after the restart.
    for (s, lease) in sessions.iter().zip(&leases) {
        s.keep_alive(*lease).await.context("renew before the kill")?;
    }
    let background = Arc::new(Counts::default());
    let (bg_stop, bg_stopped) = watch::channel(false);
    let mut load = JoinSet::new();
    for (i, s) in open_sessions(&native.url(), clients).await?.into_iter().enumerate() {
        let (background, bg_stopped) = (background.clone(), bg_stopped.clone());
        load.spawn(async move { cycle(&s, &format!("w4/bg{i}"), &background, bg_stopped).await });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut takes = JoinSet::new();
    for (i, (s, lease)) in sessions.iter().zip(&leases).enumerate() {
        let (s, lease, lock) = (s.clone(), *lease, format!("w4/held{i}"));
        takes.spawn(async move {
            match s.acquire(&lock, lease, Duration::ZERO, Duration::ZERO).await? {
                Outcome::Acquired(a) => anyhow::Ok((lock, a.lease_id, a.token)),
                other => bail!("{lock} not granted: {other:?}"),
            }
        });
    }
    let mut held = Vec::new();
    while let Some(r) = takes.join_next().await {
        let (lock, lease, token) = r??;
        counts.max_token.fetch_max(token, Ordering::Relaxed);
        held.push((lock, lease, token));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let background_ops_at_kill = background.ops();
    let killed = Instant::now();
    tokio::task::block_in_place(|| native.kill_and_restart()).context("SIGKILL and restart the server")?;
    wait_ready(native.http_addr(), Duration::from_secs(60)).await.context("the restarted server")?;
    let restart_seconds = killed.elapsed().as_secs_f64();
    let _ = bg_stop.send(true);
    drop(bg_stopped);
    while let Some(r) = load.join_next().await {
        let _ = r?; // the load ends with an error: its server is gone
    }
    let max_token_before = counts.max_token.load(Ordering::Relaxed).max(background.max_token.load(Ordering::Relaxed));

    let client = Client::connect(native.url()).await.context("connect to the restarted server")?;
    let (mut grants_verified, mut grants_missing) = (0, 0);
    for (lock, lease, token) in &held {
        let info = client.describe(lock).await.with_context(|| format!("describe {lock} after the restart"))?;
        match info.holder {
            Some(h) if h.token == *token && h.lease_id == *lease => grants_verified += 1,
            other => {
                grants_missing += 1;
                eprintln!("W4: {lock} granted to lease {lease}, token {token}; after the restart: holder {other:?}");
            }
        }
    }
    let s = client.session().await?;
    let lease = s.grant_lease(TTL).await.context("grant a lease after the restart")?;
    let first_token_after = match s.acquire("w4/after", lease, Duration::ZERO, Duration::ZERO).await? {
        Outcome::Acquired(a) => a.token,
        other => bail!("w4/after not granted after the restart: {other:?}"),
    };

    Ok(Durability {
        clients,
        acknowledged_ops: ops,
        acknowledged_grants: counts.grants.load(Ordering::Relaxed),
        fsyncs,
        fsyncs_per_op: ratio(fsyncs, ops),
        stop: "SIGKILL under load".into(),
        grants_verified,
        grants_missing,
        max_token_before,
        first_token_after,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        acknowledged_releases: counts.releases.load(Ordering::Relaxed),
        acknowledged_lease_grants: counts.lease_grants.load(Ordering::Relaxed),
        acknowledged_keep_alives: counts.keep_alives.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        log_entries,
        log_commands,
        fsyncs_per_entry: ratio(fsyncs, log_entries),
        commands_per_entry: ratio(log_commands, log_entries),
        grants_held: held.len() as u64,
        background_ops_at_kill,
        restart_seconds,
    })
}

async fn open_sessions(url: &str, n: usize) -> anyhow::Result<Vec<Session>> {
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        let client = Client::connect(url).await.with_context(|| format!("connect to {url}"))?;
        sessions.push(client.session().await.context("open a session")?);
    }
    Ok(sessions)
}

/// One client: grants a lease, then acquire → release on `lock` until `stop`,
/// renewing the lease every TTL/3 between cycles; every acknowledgement counted.
/// Returns the lease (still live). Stops at the first error.
async fn cycle(s: &Session, lock: &str, counts: &Counts, stop: watch::Receiver<bool>) -> anyhow::Result<u64> {
    let lease = s.grant_lease(TTL).await.context("grant_lease")?;
    counts.lease_grants.fetch_add(1, Ordering::Relaxed);
    let mut renewed = Instant::now();
    while !*stop.borrow() {
        if renewed.elapsed() >= TTL / 3 {
            let sent = Instant::now();
            if let Err(e) = s.keep_alive(lease).await {
                counts.error("keep_alive", &e);
                break;
            }
            counts.keep_alives.fetch_add(1, Ordering::Relaxed);
            renewed = sent;
        }
        let token = match s.acquire(lock, lease, Duration::ZERO, Duration::ZERO).await {
            Ok(Outcome::Acquired(a)) => a.token,
            Ok(other) => {
                counts.error(lock, &format!("not granted: {other:?}"));
                break;
            }
            Err(e) => {
                counts.error(lock, &e);
                break;
            }
        };
        counts.grants.fetch_add(1, Ordering::Relaxed);
        counts.max_token.fetch_max(token, Ordering::Relaxed);
        match s.release(lock, lease, token).await {
            Ok(true) => counts.releases.fetch_add(1, Ordering::Relaxed),
            Ok(false) => {
                counts.error(lock, &"release found the grant gone");
                break;
            }
            Err(e) => {
                counts.error(lock, &e);
                break;
            }
        };
    }
    Ok(lease)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

/// `strace -f -c` attached to a running process, counting its sync calls.
struct Strace {
    child: tokio::process::Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Strace {
    /// Attaches to every thread of `pid` (and follows the threads it starts);
    /// returns once strace says it is attached.
    async fn attach(pid: u32) -> anyhow::Result<Strace> {
        let dir = tempfile::Builder::new().prefix("fencelock-w4-strace").tempdir()?;
        let out = dir.path().join("summary.txt");
        let mut child = tokio::process::Command::new("strace")
            .args(["-f", "-c", "-e", SYNC_CALLS, "-o"])
            .arg(&out)
            .arg("-p")
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    anyhow::anyhow!("W4 counts fsyncs with strace, which is not installed (Debian package `strace`)")
                }
                _ => anyhow::anyhow!("cannot run strace: {e}"),
            })?;
        let mut lines = BufReader::new(child.stderr.take().context("strace's stderr")?).lines();
        let mut said = Vec::new();
        // strace says "Process N attached with M threads" (or "Process N attached") once every thread is.
        let attached = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                let done = line.contains(" attached");
                said.push(line);
                if done {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        if !attached {
            let _ = child.kill().await;
            bail!(
                "strace could not attach to the server (pid {pid}): {:?}. W4 needs ptrace on the server process \
                 (a container without CAP_SYS_PTRACE, a seccomp profile or kernel.yama.ptrace_scope can forbid it)",
                said.join("; ")
            );
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} }); // keep its stderr flowing
        Ok(Strace { child, out, _dir: dir })
    }

    /// Detaches (SIGINT: strace writes its summary and leaves the process
    /// running); the successful sync calls, and "name calls" per system call.
    async fn detach(mut self) -> anyhow::Result<(u64, String)> {
        let pid = self.child.id().context("strace exited before it was stopped")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT)?;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .context("strace did not stop within 30 s of SIGINT")??;
        let text = read(&self.out)?;
        let calls = parse_summary(&text).with_context(|| format!("strace ({status}) wrote {text:?}"))?;
        let total = calls.iter().map(|c| c.1).sum();
        let detail = if calls.is_empty() {
            "none".to_string()
        } else {
            calls.iter().map(|(name, n)| format!("{name} {n}")).collect::<Vec<_>>().join(", ")
        };
        Ok((total, detail))
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read strace's summary {}", path.display()))
}

/// Successful calls per system call from the summary table of `strace -c`
/// (calls minus errors; the `total` row left out). A strace that saw no call
/// writes nothing at all.
fn parse_summary(text: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let mut calls = Vec::new();
    let mut header = false;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"%") {
            header = f.get(4) == Some(&"calls") && f.last() == Some(&"syscall");
            if !header {
                bail!("unexpected strace summary header {line:?}");
            }
            continue;
        }
        if f.is_empty() || f[0].starts_with('-') {
            continue;
        }
        let name = *f.last().unwrap_or(&"");
        let parse = |s: &str| s.parse::<u64>().with_context(|| format!("strace summary line {line:?}"));
        // % time, seconds, usecs/call, calls, [errors,] syscall
        let (n, errors) = match f.len() {
            5 => (parse(f[3])?, 0),
            6 => (parse(f[3])?, parse(f[4])?),
            _ => bail!("unexpected strace summary line {line:?}"),
        };
        if !header {
            bail!("strace summary line {line:?} before its header");
        }
        if name != "total" {
            calls.push((name.to_string(), n - errors.min(n)));
        }
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real output of `strace -f -c -e trace=fsync,fdatasync,sync_file_range,syncfs -p PID`
    /// attached to the native server under W1 load (strace 6.1).
    const SERVER: &str = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
100.00    0.034678         178       194           fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.034678         178       194           total
";

    /// Real output for a program that called fsync 3 times, fsync on a bad fd once and fdatasync once.
    const MIXED: &str = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
  0.00    0.000000           0         4         1 fsync
  0.00    0.000000           0         1           fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.000000           0         5         1 total
";

    #[test]
    fn parses_strace_summaries() {
        assert_eq!(parse_summary(SERVER).unwrap(), vec![("fdatasync".to_string(), 194)]);
        assert_eq!(parse_summary(MIXED).unwrap(), vec![("fsync".to_string(), 3), ("fdatasync".to_string(), 1)]);
        assert_eq!(parse_summary("").unwrap(), vec![], "no call seen: strace writes nothing");
        assert!(parse_summary("strace: something else entirely\n").is_err());
    }
}
