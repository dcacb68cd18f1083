//! Issue 18 §4: jobs that run once, end to end through `fencelock serve`.
//! `run --hold-at-least` of a command that exits at once keeps the lock
//! closed after it: a second run that does not wait is busy (and `locks
//! --json` shows the lock unheld and closed for at most the hold), one that
//! waits is granted once the hold has passed. `run --once-per SLOT` records
//! the slot done with the command's exit code; a later run of that slot exits
//! 76 without starting its command and says who ran it; another slot runs.
//! Runs of one slot that start together and wait: one runs the command, the
//! others are told it ran (76, naming who) when it completes, and never run it.
#![allow(clippy::disallowed_methods)]

use crate::support;

use std::{
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{bin, cli, stderr, stdout, Server};

/// `fencelock`'s exit code for a busy lock (see `exit.rs`).
const BUSY: i32 = 73;
/// `fencelock run --once-per`'s exit code for a slot that already ran.
const SLOT_DONE: i32 = 76;

/// The hold of the test, in milliseconds (`--hold-at-least 2s`).
const HOLD_MS: u64 = 2000;

fn job_lock(server: &Server) -> Value {
    let out = cli(server, &["locks", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let locks = all["locks"].as_array().unwrap();
    locks.iter().find(|l| l["name"] == "nightly").cloned().unwrap_or(Value::Null)
}

#[test]
fn a_job_that_ends_early_keeps_a_second_run_out_until_its_hold_has_passed() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let first = cli(&server, &["run", "nightly", "--hold-at-least", "2s", "--", "true"]);
    assert!(first.status.success(), "{}", stderr(&first));
    // The command has exited and released: nobody holds the lock, yet it is closed.
    let second = cli(&server, &["acquire", "nightly", "--ttl", "1h"]);
    assert_eq!(second.status.code(), Some(BUSY), "{}", stderr(&second));
    assert!(stderr(&second).contains("hold-at-least") || stdout(&second).contains("hold-at-least"));
    let lock = job_lock(&server);
    assert_eq!(lock["holders"], serde_json::json!([]), "{lock}");
    let left = lock["reopens_in_ms"].as_u64().unwrap_or_else(|| panic!("closed lock expected: {lock}"));
    assert!(left > 0 && left <= HOLD_MS, "reopens in {left} ms: {lock}");
    // A run that waits gets the lock once the hold has passed.
    let third = cli(&server, &["acquire", "nightly", "--ttl", "1h", "--wait", "5s", "--json"]);
    assert!(third.status.success(), "{}", stderr(&third));
    let got: Value = serde_json::from_str(&stdout(&third)).unwrap();
    assert_eq!(got["outcome"], "acquired", "{got}");
    assert_eq!(job_lock(&server)["reopens_in_ms"], Value::Null);
}

#[test]
fn a_hold_above_24_hours_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let marker = tmp.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = cli(&server, &["run", "nightly", "--hold-at-least", "25h", "--", "sh", "-c", &touch]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("hold-at-least 90000000 ms is out of range (at most 24 h)"), "{}", stderr(&out));
    assert!(!marker.exists(), "the command ran");
}

#[test]
fn a_slot_runs_once_and_a_later_run_says_who_ran_it() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let slot = ["--once-per", "2026-11-23", "--identity", "host-a:1"];
    let first = cli(&server, &[&["run", "nightly"][..], &slot, &["--", "sh", "-c", "exit 3"]].concat());
    assert_eq!(first.status.code(), Some(3), "the command's own code: {}", stderr(&first));
    let marker = tmp.path().join("ran-twice");
    let touch = format!("touch {}", marker.display());
    let again = ["run", "nightly", "--once-per", "2026-11-23", "--", "sh", "-c", &touch];
    let second = cli(&server, &again);
    assert_eq!(second.status.code(), Some(SLOT_DONE), "{}", stderr(&second));
    let said = stderr(&second);
    let by = "fencelock: slot \"2026-11-23\" of lock \"nightly\" already ran: by host-a:1 (token ";
    assert!(said.contains(by) && said.contains(", exit 3)"), "{said}");
    assert!(!marker.exists(), "the command of a done slot ran");
    // Another slot of the same lock runs; so does the lock without a slot.
    let other = cli(&server, &["run", "nightly", "--once-per", "2026-11-24", "--", "true"]);
    assert!(other.status.success(), "{}", stderr(&other));
    let plain = cli(&server, &["run", "nightly", "--", "true"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    // `fencelock slots` lists both, newest first, with who ran each and how.
    let listed = cli(&server, &["slots", "nightly"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let lines: Vec<String> = stdout(&listed).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("2026-11-24  ran by "), "{lines:?}");
    assert!(
        lines[1].starts_with("2026-11-23  ran by host-a:1 (token ") && lines[1].contains("), exit 3, "),
        "{lines:?}"
    );
    let json: Value = serde_json::from_str(&stdout(&cli(&server, &["slots", "nightly", "--json"]))).unwrap();
    let slots: Vec<_> =
        json["slots"].as_array().unwrap().iter().map(|s| (s["slot"].clone(), s["exit_code"].clone())).collect();
    assert_eq!(slots, [("2026-11-24".into(), 0.into()), ("2026-11-23".into(), 3.into())]);
}

#[test]
fn once_per_day_names_the_current_utc_day() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let first = cli(&server, &["run", "daily", "--once-per", "day", "--", "true"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = cli(&server, &["run", "daily", "--once-per", "day", "--", "true"]);
    // (Only a run that straddles midnight UTC would see another day here.)
    assert_eq!(second.status.code(), Some(SLOT_DONE), "{}", stderr(&second));
    let said = stderr(&second);
    let slot = said.split('"').nth(1).unwrap_or_default();
    let shape: Vec<usize> = slot.split('-').map(str::len).collect();
    assert_eq!(shape, [4, 2, 2], "a YYYY-MM-DD slot: {said}");
}

/// `fencelock run NAME ARGS…` against `server`, started now, its output piped.
fn start_run(server: &Server, args: &[&str]) -> Child {
    let mut c = Command::new(bin());
    c.arg("run").args(args).env("FENCELOCK_SERVER", server.url());
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start fencelock run")
}

/// Waits for every child, killing them all if any is still running after
/// `within` (then the test fails).
fn finish_all(children: Vec<Child>, within: Duration) -> Vec<Output> {
    let start = Instant::now();
    let mut children = children;
    while children.iter_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
        if start.elapsed() > within {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("a run did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children.into_iter().map(|c| c.wait_with_output().expect("a run's output")).collect()
}

/// Issue 18 §4: three runs of one slot start together and wait (`--wait 20s`).
/// The command (it appends a line, sleeps 300 ms, exits 0) runs exactly once;
/// the two runs that waited exit 76 naming the identity of the one that ran,
/// without running it.
#[test]
fn runs_of_one_slot_that_wait_run_it_once_and_the_others_are_told_who_ran_it() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let ran = tmp.path().join("ran");
    let job = format!("echo \"$FENCELOCK_TOKEN\" >> {} && sleep 0.3", ran.display());
    let runs: Vec<Child> = (1..=3)
        .map(|i| {
            let identity = format!("host-{i}:1");
            let args = ["nightly", "--once-per", "2026-11-23", "--wait", "20s", "--identity", &identity];
            start_run(&server, &[&args[..], &["--", "sh", "-c", &job]].concat())
        })
        .collect();
    let outs = finish_all(runs, Duration::from_secs(40));
    let lines = std::fs::read_to_string(&ran).unwrap();
    assert_eq!(lines.lines().count(), 1, "the job ran once: {lines:?}");
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    let ran_it: Vec<usize> = (0..3).filter(|i| codes[*i] == Some(0)).collect();
    assert_eq!(ran_it.len(), 1, "exactly one run exits 0: {codes:?}");
    let who = format!("by host-{}:1 (token {}, exit 0)", ran_it[0] + 1, lines.trim());
    for (i, out) in outs.iter().enumerate().filter(|(i, _)| *i != ran_it[0]) {
        assert_eq!(out.status.code(), Some(SLOT_DONE), "run {i}: {}", stderr(out));
        let said = stderr(out);
        assert!(
            said.contains("slot \"2026-11-23\" of lock \"nightly\" already ran: ") && said.contains(&who),
            "{said}"
        );
    }
}

/// Issue 18 §4 with INV-17: a run holds its slot's lock with a one-hour
/// `--hold-at-least`; a run of the same slot queues behind it (`--wait 30s`).
/// When the first completes the slot, the waiter exits 76 naming who ran it,
/// although the lock stays closed for the rest of the hour: a waiter learns
/// the job ran when it is completed, not when the hold ends.
#[test]
fn a_waiter_hears_the_slot_ran_while_the_hold_at_least_keeps_the_lock_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let (go, ran, token) = (tmp.path().join("go"), tmp.path().join("ran"), tmp.path().join("token"));
    let first_job = format!(
        "echo \"$FENCELOCK_TOKEN\" > {}; while [ ! -f {} ]; do sleep 0.05; done",
        token.display(),
        go.display()
    );
    let slot = ["nightly", "--once-per", "2026-11-26"];
    let first_args = [&slot[..], &["--hold-at-least", "1h", "--identity", "host-1:1", "--", "sh", "-c", &first_job]];
    let first = start_run(&server, &first_args.concat());
    wait_for(|| job_lock(&server)["holders"].as_array().is_some_and(|h| h.len() == 1), "the first run holds");
    let second_job = format!("echo ran >> {}", ran.display());
    let second_args = [&slot[..], &["--wait", "30s", "--identity", "host-2:1", "--", "sh", "-c", &second_job]];
    let second = start_run(&server, &second_args.concat());
    wait_for(|| job_lock(&server)["waiters"].as_u64() == Some(1), "the second run waits");
    std::fs::write(&go, b"").unwrap();
    let outs = finish_all(vec![first, second], Duration::from_secs(40));
    assert_eq!(outs[0].status.code(), Some(0), "{}", stderr(&outs[0]));
    assert_eq!(outs[1].status.code(), Some(SLOT_DONE), "{}", stderr(&outs[1]));
    let who = format!("by host-1:1 (token {}, exit 0)", std::fs::read_to_string(&token).unwrap().trim());
    assert!(stderr(&outs[1]).contains(&who), "{}", stderr(&outs[1]));
    assert!(!ran.exists(), "the waiter never ran its command");
    let lock = job_lock(&server);
    let left = lock["reopens_in_ms"].as_u64().unwrap_or_else(|| panic!("still closed by the hold: {lock}"));
    assert!(left > 0, "{lock}");
}

/// Polls `ok` every 20 ms for up to 20 s; fails the test naming `what`.
fn wait_for(ok: impl Fn() -> bool, what: &str) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
