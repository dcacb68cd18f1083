//! Issue 18 §4: jobs that run once, end to end through `fencelock serve`.
//! `run --hold-at-least` of a command that exits at once keeps the lock
//! closed after it: a second run that does not wait is busy (and `locks
//! --json` shows the lock unheld and closed for at most the hold), one that
//! waits is granted once the hold has passed.
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::Value;
use support::{cli, stderr, stdout, Server};

/// `fencelock`'s exit code for a busy lock (see `exit.rs`).
const BUSY: i32 = 73;

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
