//! INV-4 and INV-11 end to end: a `fencelock run` holder paused with SIGSTOP past
//! its TTL loses the lock; a waiter gets it with a larger token; once the holder
//! resumes, it notices the loss, kills its child and exits with code 75.

#![allow(clippy::disallowed_methods)] // the test times processes by the clock

use crate::support;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use support::{cli, stdout, Server};

#[test]
fn paused_runner_loses_lock_and_its_child_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let pidfile = tmp.path().join("child.pid");
    let tokfile = tmp.path().join("child.token");
    let script =
        format!("echo $FENCELOCK_TOKEN > {}; echo $$ > {}; exec sleep 60", tokfile.display(), pidfile.display());
    let mut runner = Command::new(support::bin())
        .args([
            "run",
            "paused",
            "--ttl",
            "1s",
            "--kill-grace",
            "1s",
            "--server",
            &server.url(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child_pid: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    let holder_token: u64 = wait_for_file(&tokfile).trim().parse().unwrap();

    let runner_pid = Pid::from_raw(runner.id() as i32);
    kill(runner_pid, Signal::SIGSTOP).unwrap();
    assert!(wait_state(runner.id() as i32, 'T'), "the fault must have happened: runner stopped");

    // The waiter is granted once the paused holder's lease expires.
    let out = cli(&server, &["acquire", "paused", "--wait", "10s", "--ttl", "10s", "--json"]);
    assert!(out.status.success(), "waiter did not get the lock: {out:?}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let waiter_token = v["token"].as_u64().unwrap();
    assert!(waiter_token > holder_token, "waiter token {waiter_token} must exceed holder token {holder_token}");
    assert!(proc_alive(child_pid), "the child keeps running while its runner is paused");

    kill(runner_pid, Signal::SIGCONT).unwrap();
    let status = wait_timeout(&mut runner, Duration::from_secs(20)).expect("runner exits after resuming");
    let mut err = String::new();
    std::io::Read::read_to_string(runner.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(75), "exit code for a lost lease; stderr: {err}");
    assert!(err.contains("lease lost"), "stderr says why: {err}");
    assert!(!proc_alive(child_pid), "the child (sleep 60) was killed");
}

fn wait_for_file(p: &std::path::Path) -> String {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(s) = std::fs::read_to_string(p) {
            if s.ends_with('\n') {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} never appeared", p.display());
}

/// The state letter of /proc/PID/stat (R, S, T, Z, …).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Wait (up to 5 s) until the process is in `state`; signals arrive asynchronously.
fn wait_state(pid: i32, state: char) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if proc_state(pid) == Some(state) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn proc_alive(pid: i32) -> bool {
    matches!(proc_state(pid), Some(c) if c != 'Z')
}

fn wait_timeout(c: &mut std::process::Child, within: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    None
}
