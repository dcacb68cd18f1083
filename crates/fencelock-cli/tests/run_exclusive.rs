//! INV-1 end to end: two `fencelock run` processes looping on one lock never run
//! their children at the same time, and each child sees a larger token (INV-2).

mod support;

use std::{process::Command, thread};

use support::{bin, Server};

const RUNS_PER_RUNNER: usize = 4;

#[test]
fn two_runners_never_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let log = tmp.path().join("intervals.log");
    // Each child appends "start <ns> <token>", sleeps, appends "end <ns> <token>".
    let script = format!(
        "echo \"start $(date +%s%N) $FENCELOCK_TOKEN\" >> {l}; sleep 0.2; echo \"end $(date +%s%N) $FENCELOCK_TOKEN\" >> {l}",
        l = log.display()
    );
    let runners: Vec<_> = (0..2)
        .map(|_| {
            let (url, script) = (server.url(), script.clone());
            thread::spawn(move || {
                for _ in 0..RUNS_PER_RUNNER {
                    let out = Command::new(bin())
                        .args(["run", "nightly", "--ttl", "2s", "--wait", "30s", "--server", &url, "--", "sh", "-c", &script])
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
    let intervals = parse_intervals(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(intervals.len(), 2 * RUNS_PER_RUNNER, "every run must have run its child once");
    for pair in intervals.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(b.start >= a.end, "children overlapped: {a:?} and {b:?}");
        assert!(b.token > a.token, "token did not increase from {a:?} to {b:?}");
    }
}

#[derive(Debug)]
struct Interval {
    start: u128,
    end: u128,
    token: u64,
}

/// Pair start/end lines by token and sort by start time.
fn parse_intervals(text: &str) -> Vec<Interval> {
    let mut starts = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, ns, token): (&str, u128, u64) = (f[0], f[1].parse().unwrap(), f[2].parse().unwrap());
        match kind {
            "start" => assert!(starts.insert(token, ns).is_none(), "token {token} ran twice"),
            _ => out.push(Interval { start: starts[&token], end: ns, token }),
        }
    }
    out.sort_by_key(|i| i.start);
    out
}
