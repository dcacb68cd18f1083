//! `fencelock run` stops the processes its command detaches (issue 37 §2;
//! Consul#2022 is this bug in `consul lock`): a grandchild that leaves the
//! command's process group with `setsid` is re-parented to `run` (a child
//! subreaper) and gets SIGTERM, then SIGKILL after `--kill-grace`, when the
//! command exits or the lease is lost; `run` reaps it before it returns, and
//! exits with the command's code, or 75 when the lease was lost.
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{bin, http_get, http_request, Server};

/// The pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(20);
/// The most polls of any wait (20 s); only reached when a test fails.
const POLLS: u32 = 1000;

/// Starts (in the background, with `&`) a grandchild that leaves the
/// command's process group and session with `setsid`, runs `before` (shell
/// text), writes its pid to `gc.pid` and becomes `sleep 600`; then waits (a
/// bounded number of polls) until `gc.pid` is written. The command's script
/// goes on after this text.
fn detach_grandchild(before: &str) -> String {
    format!(
        "setsid sh -c '{before} echo $$ > gc.tmp && mv gc.tmp gc.pid; exec sleep 600' & \
         i=0; while [ ! -s gc.pid ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; "
    )
}

/// `fencelock run NAME FLAGS -- sh -c SCRIPT` in `dir`, its stderr in `dir/run.err`.
fn start_run(server: &Server, dir: &Path, name: &str, flags: &[&str], script: &str) -> Child {
    let err = std::fs::File::create(dir.join("run.err")).unwrap();
    Command::new(bin())
        .args(["run", name, "--server", &server.url()])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn fencelock run")
}

/// `run`'s exit status, within [`POLLS`] polls.
fn exit_of(run: &mut Child, dir: &Path) -> ExitStatus {
    for _ in 0..POLLS {
        if let Some(status) = run.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(POLL);
    }
    let _ = run.kill();
    panic!("fencelock run did not exit within {POLLS} polls; stderr:\n{}", run_err(dir));
}

fn run_err(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("run.err")).unwrap_or_default()
}

/// The grandchild's pid from `dir/gc.pid`, within [`POLLS`] polls.
fn grandchild(dir: &Path) -> Grandchild {
    for _ in 0..POLLS {
        if let Some(pid) = std::fs::read_to_string(dir.join("gc.pid")).ok().and_then(|t| t.trim().parse().ok()) {
            return Grandchild(pid);
        }
        std::thread::sleep(POLL);
    }
    panic!("the grandchild did not start within {POLLS} polls; stderr:\n{}", run_err(dir));
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
    state.is_some_and(|s| s != "Z")
}

/// The detached `sleep 600`; SIGKILLed when the test ends if it still runs
/// (a failed test leaves nothing behind).
struct Grandchild(i32);

impl Grandchild {
    /// Whether it has exited within a few polls (the wait is `run`'s, which
    /// reaps it before it returns; the polls only absorb scheduling).
    fn gone(&self) -> bool {
        for _ in 0..25 {
            if !running(self.0) {
                return true;
            }
            std::thread::sleep(POLL);
        }
        false
    }

    fn is_sleep(&self) -> bool {
        std::fs::read(format!("/proc/{}/cmdline", self.0)).is_ok_and(|c| c.starts_with(b"sleep\0"))
    }
}

impl Drop for Grandchild {
    fn drop(&mut self) {
        if running(self.0) && self.is_sleep() {
            let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
        }
    }
}

/// Rule: when the command exits, a grandchild it detached with `setsid`
/// (out of the command's process group, so no group signal reaches it) is
/// stopped and reaped before `run` returns; `run` exits with the command's
/// code. A process that is not `run`'s descendant is left alone.
#[test]
fn a_detached_grandchild_is_stopped_when_the_command_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let bystander =
        Bystander(Command::new("sleep").arg("600").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    let script = format!("{}exit 3", detach_grandchild(""));
    let mut run = start_run(&server, tmp.path(), "desc-exit", &[], &script);
    let status = exit_of(&mut run, tmp.path());
    let gc = grandchild(tmp.path());
    assert_eq!(status.code(), Some(3), "the command's exit code; stderr:\n{}", run_err(tmp.path()));
    assert!(gc.gone(), "the detached grandchild {} outlived fencelock run", gc.0);
    assert!(running(bystander.0.id() as i32), "a process that is not run's descendant was stopped");
}

/// A process of the test's own (not `run`'s descendant); killed on drop.
struct Bystander(Child);

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Rule: when the lease is lost (revoked from outside through the admin
/// port) while a detached grandchild runs, the grandchild is stopped too and
/// `run` exits 75.
#[test]
fn a_detached_grandchild_is_stopped_when_the_lease_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let script = format!("{}exec sleep 600", detach_grandchild(""));
    let flags = ["--ttl", "3s", "--kill-grace", "2s"];
    let mut run = start_run(&server, tmp.path(), "desc-lost", &flags, &script);
    let gc = grandchild(tmp.path());
    assert!(running(gc.0), "the grandchild should run while the lease is held");

    let (code, body) = http_get(server.http, "/v1/locks/desc-lost").unwrap();
    assert_eq!(code, 200, "{body}");
    let lock: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lease = support::id(&lock["holder"]["lease_id"]).unwrap_or_else(|| panic!("no holder: {body}"));
    let (code, body) = http_request(server.http, "DELETE", &format!("/v1/leases/{lease}"), &[], b"").unwrap();
    assert_eq!(code, 200, "revoking lease {lease}: {body}");

    let status = exit_of(&mut run, tmp.path());
    assert_eq!(status.code(), Some(75), "exit code for a lost lease; stderr:\n{}", run_err(tmp.path()));
    assert!(gc.gone(), "the detached grandchild {} outlived the lease", gc.0);
}

/// Rule: a detached grandchild that ignores SIGTERM is SIGKILLed once
/// `--kill-grace` has passed (not before), and `run` still exits with the
/// command's code.
#[test]
fn a_grandchild_that_ignores_sigterm_is_killed_after_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    // An ignored signal stays ignored across exec: the `sleep` ignores SIGTERM.
    let script = format!("{}exit 0", detach_grandchild("trap \"\" TERM;"));
    let grace = Duration::from_secs(1);
    let mut run = start_run(&server, tmp.path(), "desc-kill", &["--kill-grace", "1s"], &script);
    let gc = grandchild(tmp.path());
    let started = Instant::now();
    let status = exit_of(&mut run, tmp.path());
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "the command's exit code; stderr:\n{}", run_err(tmp.path()));
    assert!(gc.gone(), "the grandchild {} that ignores SIGTERM outlived fencelock run", gc.0);
    assert!(took >= grace - POLL * 5, "SIGKILL came {took:?} after the command exited, before the {grace:?} grace");
    assert!(run_err(tmp.path()).contains("sending SIGKILL"), "stderr:\n{}", run_err(tmp.path()));
}
