//! Child processes of the harness: the lock server and the fenced storage
//! server (this binary's hidden `serve` and `storage` subcommands) and the
//! workers (`worker_process`), each with its own log file; `/proc` state
//! reads for the evidence that a SIGSTOP really stopped a process.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::http;

/// This executable, re-run for every child.
pub fn self_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find the harness's own executable")
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z`…).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state
    // follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

pub fn signal(pid: u32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), sig);
}

/// A server child process that can be killed and started again on the same
/// ports and data dir.
pub struct ServerProc {
    pub name: &'static str,
    pub(crate) args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// Environment of the next start (a failpoint, a mutant, the shim…).
    pub env: BTreeMap<String, String>,
    /// `GET` this path on `health` answers 200 when it is ready.
    pub(crate) health: (SocketAddr, &'static str),
}

impl ServerProc {
    pub fn new(name: &'static str, args: Vec<String>, log: PathBuf, health: (SocketAddr, &'static str)) -> Self {
        ServerProc { name, args, log, child: None, env: BTreeMap::new(), health }
    }

    /// Starts the process and waits until it answers its health check.
    pub async fn start(&mut self) -> anyhow::Result<u32> {
        let log = File::options().create(true).append(true).open(&self.log)?;
        let child = Command::new(self_exe()?)
            .args(&self.args)
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.name))?;
        let pid = child.id();
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(30)).await?;
        Ok(pid)
    }

    async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited while starting ({status}); the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    log_tail(&self.log, 20)
                );
            }
            let r = http::request(self.health.0, "GET", self.health.1, &[], b"", Duration::from_secs(1)).await;
            if r.is_ok_and(|r| r.status == 200) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{} not ready within {} s; see {}", self.name, within.as_secs(), self.log.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` if the process has ended (and is reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// SIGKILL and reap; returns the pid it had.
    pub fn kill(&mut self) -> Option<u32> {
        let mut child = self.child.take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        signal(child.id(), Signal::SIGCONT);
        signal(child.id(), Signal::SIGTERM);
        for _ in 0..500 {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The lock server: `fencelock-chaos serve`.
pub fn lock_server(data: &Path, grpc: SocketAddr, http: SocketAddr, log: PathBuf) -> ServerProc {
    let args = vec![
        "serve".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--grpc".into(),
        grpc.to_string(),
        "--http".into(),
        http.to_string(),
    ];
    ServerProc::new("lock server", args, log, (http, "/healthz"))
}

/// Node `id` of a group of `peers` (`1=host:port,…`): `fencelock-chaos serve`.
/// Ready when its admin endpoint answers `/v1/cluster` (a follower never
/// answers `/healthz` with 200).
pub fn cluster_node(data: &Path, id: u64, peers: &str, grpc: SocketAddr, http: SocketAddr, log: PathBuf) -> ServerProc {
    let mut s = lock_server(data, grpc, http, log);
    s.args.extend(["--node-id".into(), id.to_string(), "--peers".into(), peers.to_string()]);
    s.name = "cluster node";
    s.health = (http, "/v1/cluster");
    s
}

/// The fenced storage server: `fencelock-chaos storage`.
pub fn storage_server(data: &Path, listen: SocketAddr, unfenced: bool, log: PathBuf) -> ServerProc {
    let mut args =
        vec!["storage".into(), "--data-dir".into(), data.display().to_string(), "--listen".into(), listen.to_string()];
    if unfenced {
        args.push("--unfenced".into());
    }
    ServerProc::new("storage server", args, log, (listen, "/healthz"))
}

/// The last `lines` lines of a child's log: a failure report must say why
/// the child failed, since the run's directory may be gone when it is read.
fn log_tail(log: &Path, lines: usize) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

/// A free port of 127.0.0.1.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], fencelock_testkit::free_port()))
}
