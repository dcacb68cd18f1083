//! Real servers and network faults for fencelock's tests and benchmarks.
//!
//! Each server runs from Debian's packages on a free port of 127.0.0.1 with its
//! data in a temporary directory, is started and waited for here, and is
//! killed on drop: [`RedisServer`], [`PgServer`], [`EtcdServer`],
//! [`ZkServer`]. Each runs in the [`Profile`] asked for: `Test` (the default,
//! short timers for fast tests) or `Production` (as its operators run it, for
//! the bench); [`describe`](ZkServer::describe) says how, in one line. A missing binary fails the test (never skips it) with a
//! message naming `scripts/install-test-deps.sh`. [`proxy`] is a userspace TCP
//! proxy that cuts, holds or resets connections on command. [`cmdline`] writes
//! a harness tool's command line for its report as a user would type it.
//! [`browser`] drives a headless Chromium through ChromeDriver, for the tests
//! of a web page.
//!
//! Waiting for readiness is bounded by a count of polls, not a clock: the
//! workspace reads no clock outside the server's clock module.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub mod browser;
pub mod certs;
pub mod cmdline;
mod etcd;
mod postgres;
pub mod proxy;
mod redis;
mod zookeeper;

pub use certs::TestCerts;
pub use etcd::EtcdServer;
pub use postgres::{PgServer, PG_SECURE_USER};
pub use redis::{RedisSecurity, RedisServer};
pub use zookeeper::ZkServer;

/// How a peer server is configured.
///
/// `Test` is what the tests rely on: short timers (ZooKeeper ticks every
/// 100 ms so sessions may be 200 ms; etcd elects in 200 ms, which lowers its
/// minimum lease to 1 s) and small memory. `Production` is what an operator
/// would run, for the bench to measure: each server's defaults for timers and
/// its garbage collector, memory for the load, durable writes, logging at
/// warning level to a file. What each server changes is in its `start_profile`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Profile {
    #[default]
    Test,
    Production,
}

pub(crate) const INSTALL_HINT: &str =
    "run scripts/install-test-deps.sh (it installs postgresql, redis-server, etcd-server and zookeeper)";

/// How many polls, 20 ms apart, a server gets to become ready (about a
/// minute) before the test fails. A bound on waiting, not a timing
/// assertion; counted rather than clocked, as the workspace reads no clock
/// outside the server's clock module.
pub(crate) const READY_POLLS: u32 = 3000;
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// The name libtest knows the test `name` of the module `module_path` by
/// (`module_path!()` of the test's file), for a test that runs itself again in a
/// child process with `--exact`: the path without the test binary's crate
/// (`it::faults` and `a_test` give `faults::a_test`).
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

/// A port of 127.0.0.1 that nobody listens on right now, for a server the
/// test starts next.
///
/// Taken from below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768–60999 by default): a port the kernel handed out for `bind(:0)` and
/// that the test then released can be taken again, before the server binds
/// it, as the source port of any outgoing connection of any process (the
/// tests make thousands); a port below the range is never handed out by the
/// kernel. Processes start at different points of the range (by pid), each
/// walks it in steps, and a port is returned only if it can be bound now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let high = ephemeral_low().clamp(LOW + 1_000, 32_768);
    let span = high - LOW;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + step.wrapping_mul(13)) % span;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port in 127.0.0.1:{LOW}..{high}");
}

/// The low end of the kernel's ephemeral port range.
fn ephemeral_low() -> u32 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A temporary directory that another user (postgres) can enter.
pub(crate) fn shared_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The last lines of a server's log, for a failure message.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Signal `child` and wait for it; SIGKILL if it outlives `polls` polls.
pub(crate) fn stop_child(child: &mut Child, signal: Signal, polls: u32) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), signal);
    for _ in 0..polls {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Polls `ready` until it holds, failing with the server's log if `child` exits
/// or after [`READY_POLLS`] polls. A server that lost the race for its port
/// (another test's server bound it between [`free_port`] and the spawn) exits,
/// while the other server answers `ready`: so the child must still be alive
/// after `ready` holds, and a few polls later too.
pub(crate) fn wait_ready(what: &str, child: &mut Child, log: &Path, mut ready: impl FnMut() -> bool) {
    for poll in 0.. {
        if ready() {
            for _ in 0..5 {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("{what} exited ({status}) while something else answered on its port:\n{}", log_tail(log));
                }
                sleep(POLL);
            }
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what} exited ({status}):\n{}", log_tail(log));
        }
        assert!(poll < READY_POLLS, "{what} not ready:\n{}", log_tail(log));
        sleep(POLL);
    }
}

pub(crate) fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
