//! `fencelock run --all` end to end (issue 18, part 3), on a real `fencelock
//! serve`: two runners that name the same two locks in crossed orders both
//! finish every run (no deadlock), their children never overlap (INV-1 on
//! each lock), and each child sees one token per lock, consecutive, from one
//! grant (INV-18). A backend without multi-locks refuses before the command
//! runs.

use crate::support;

use std::{process::Command, thread};

use fencelock_testkit::RedisServer;
use support::{bin, Server};

const RUNS_PER_RUNNER: usize = 3;

#[test]
fn inv18_two_runs_of_crossed_multi_locks_both_finish_and_never_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let log = tmp.path().join("intervals.log");
    // Each child appends "start <ns> <pid> <tokens>", sleeps, appends "end …".
    let script = format!(
        "echo \"start $(date +%s%N) $$ $FENCELOCK_TOKENS\" >> {l}; sleep 0.2; \
         echo \"end $(date +%s%N) $$ $FENCELOCK_TOKENS\" >> {l}",
        l = log.display()
    );
    let runners: Vec<_> = ["x,y", "y,x"]
        .into_iter()
        .map(|all| {
            let (url, script) = (server.url(), script.clone());
            thread::spawn(move || {
                for _ in 0..RUNS_PER_RUNNER {
                    let out = Command::new(bin())
                        .args(["run", "--all", all, "--ttl", "2s", "--wait", "30s", "--server", &url, "--"])
                        .args(["sh", "-c", &script])
                        .output()
                        .expect("run fencelock run");
                    assert!(out.status.success(), "fencelock run failed: {}", String::from_utf8_lossy(&out.stderr));
                }
            })
        })
        .collect();
    for r in runners {
        r.join().expect("runner thread");
    }
    let mut runs = parse(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(runs.len(), 2 * RUNS_PER_RUNNER, "every run ran its child once");
    runs.sort_by_key(|r| r.start);
    for pair in runs.windows(2) {
        assert!(pair[1].start >= pair[0].end, "children overlapped: {:?} and {:?}", pair[0], pair[1]);
    }
    for r in &runs {
        let names: Vec<&str> = r.tokens.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names == ["x", "y"] || names == ["y", "x"], "one token per lock, in the order named: {r:?}");
        assert_eq!(r.tokens[1].1, r.tokens[0].1 + 1, "INV-18: one grant, consecutive tokens: {r:?}");
    }
}

/// `fencelock acquire --all` hands a multi-lock to a script: every lock with
/// its token (consecutive, in the order named) on one lease; a second one
/// that shares a lock is busy (exit 73) and takes nothing.
#[test]
fn inv18_acquire_all_prints_every_lock_with_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let url = server.url();
    let acquire = |all: &str| {
        let out = Command::new(bin()).args(["acquire", "--all", all, "--json", "--server", &url]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        (out.status.code(), v)
    };
    let (code, v) = acquire("p,q");
    assert_eq!(code, Some(0), "{v}");
    let locks = v["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks.iter().map(|l| l["lock"].as_str().unwrap()).collect();
    assert_eq!(names, ["p", "q"]);
    assert_eq!(locks[1]["token"].as_u64().unwrap(), locks[0]["token"].as_u64().unwrap() + 1, "{v}");
    let (code, v) = acquire("r,q");
    assert_eq!((code, v["outcome"].as_str()), (Some(73), Some("busy")), "{v}");
    let (code, v) = acquire("r,s");
    assert_eq!(code, Some(0), "r was not taken by the busy one: {v}");
}

#[test]
fn run_all_is_refused_before_the_command_runs_where_the_backend_has_no_multi_lock() {
    let redis = RedisServer::start_volatile();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    let out = Command::new(bin())
        .args(["run", "--all", "x,y", "--server", &redis.url(), "--", "touch", marker.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("multi-lock"), "{err}");
    assert!(!marker.exists(), "the command ran without its locks");
    // --all names the locks: not with NAME, nor with a semaphore's permits.
    for args in [&["run", "x", "--all", "x,y"][..], &["run", "--all", "x,y", "--permits", "2"][..]] {
        let out = Command::new(bin()).args(args).args(["--server", &redis.url(), "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[derive(Debug)]
struct Run {
    start: u128,
    end: u128,
    tokens: Vec<(String, u64)>,
}

/// Pair start/end lines by the child's pid.
fn parse(text: &str) -> Vec<Run> {
    let mut starts = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, ns, pid) = (f[0], f[1].parse::<u128>().unwrap(), f[2]);
        let tokens = f[3].split(',').map(|e| {
            let (name, token) = e.rsplit_once('=').expect("lock=token");
            (name.to_string(), token.parse().expect("a token"))
        });
        match kind {
            "start" => assert!(starts.insert(pid.to_string(), ns).is_none(), "pid {pid} ran twice"),
            _ => out.push(Run { start: starts[pid], end: ns, tokens: tokens.collect() }),
        }
    }
    out
}
