//! INV-1 end to end, on every backend: two `fencelock run` processes looping on
//! one lock never run their children at the same time, and where the backend
//! gives fencing tokens each child sees a larger one (INV-2). The command is the
//! same for every backend; only `--server` changes (issue 4's "done when").

use crate::support;

use std::{process::Command, thread};

use fencelock_testkit::{EtcdServer, PgServer, RedisServer, ZkServer};
use support::{bin, Server};

const RUNS_PER_RUNNER: usize = 4;

#[test]
fn two_runners_never_overlap_on_fencelock() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    two_runners_never_overlap(&server.url(), true);
}

#[test]
fn two_runners_never_overlap_on_redis() {
    let redis = RedisServer::start_volatile();
    two_runners_never_overlap(&redis.url(), true);
}

#[test]
fn two_runners_never_overlap_on_redlock() {
    let nodes = [RedisServer::start_volatile(), RedisServer::start_volatile(), RedisServer::start_volatile()];
    let hosts: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
    two_runners_never_overlap(&format!("redlock://{}", hosts.join(",")), false);
}

#[test]
fn two_runners_never_overlap_on_etcd() {
    let etcd = EtcdServer::start();
    two_runners_never_overlap(&etcd.url(), true);
}

#[test]
fn two_runners_never_overlap_on_zookeeper() {
    let zk = ZkServer::start();
    two_runners_never_overlap(&zk.url(), true);
}

#[test]
fn two_runners_never_overlap_on_postgres() {
    let pg = PgServer::start();
    two_runners_never_overlap(&pg.url(), true);
}

#[test]
fn two_runners_never_overlap_on_postgres_advisory_locks() {
    let pg = PgServer::start();
    two_runners_never_overlap(&format!("{}?mode=advisory", pg.url()), false);
}

/// Redlock and advisory locks give no token: `--require-fencing` refuses them
/// before the command runs, with the usage error's exit code 70 and a reason.
#[test]
fn require_fencing_refuses_a_backend_without_tokens() {
    let nodes = [RedisServer::start_volatile(), RedisServer::start_volatile(), RedisServer::start_volatile()];
    let hosts: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    let url = format!("redlock://{}", hosts.join(","));
    let out = Command::new(bin())
        .args(["run", "job", "--require-fencing", "--server", &url, "--", "touch", marker.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fencing"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!marker.exists(), "the command ran without the fencing it required");
}

fn two_runners_never_overlap(url: &str, fenced: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("intervals.log");
    // Each child appends "start <ns> <pid> <token>", sleeps, appends "end …".
    let script = format!(
        "echo \"start $(date +%s%N) $$ ${{FENCELOCK_TOKEN:-none}}\" >> {l}; sleep 0.2; \
         echo \"end $(date +%s%N) $$ ${{FENCELOCK_TOKEN:-none}}\" >> {l}",
        l = log.display()
    );
    let runners: Vec<_> = (0..2)
        .map(|_| {
            let (url, script) = (url.to_string(), script.clone());
            thread::spawn(move || {
                for _ in 0..RUNS_PER_RUNNER {
                    let out = Command::new(bin())
                        .args([
                            "run", "nightly", "--ttl", "2s", "--wait", "30s", "--server", &url, "--", "sh", "-c",
                            &script,
                        ])
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
        match (a.token, b.token) {
            (Some(ta), Some(tb)) => assert!(tb > ta, "token did not increase from {a:?} to {b:?}"),
            (None, None) => assert!(!fenced, "{url} gave no token"),
            _ => panic!("tokens only sometimes: {a:?} {b:?}"),
        }
    }
}

#[derive(Debug)]
struct Interval {
    start: u128,
    end: u128,
    token: Option<u64>,
}

/// Pair start/end lines by the child's pid and sort by start time.
fn parse_intervals(text: &str) -> Vec<Interval> {
    let mut starts = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, ns, pid, token) = (f[0], f[1].parse::<u128>().unwrap(), f[2], f[3].parse::<u64>().ok());
        match kind {
            "start" => assert!(starts.insert(pid.to_string(), ns).is_none(), "pid {pid} ran twice"),
            _ => out.push(Interval { start: starts[pid], end: ns, token }),
        }
    }
    out.sort_by_key(|i| i.start);
    out
}

/// Nothing of a `fencelock run` or `fencelock elect` outlives it: the lease
/// its lock was on is revoked before it exits, not left to live out its TTL
/// (a minute here), where it would count against the identity's lease quota
/// and show as an active lease on the node.
#[test]
fn run_and_elect_leave_no_lease_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let active = || {
        let (status, body) = support::http_get(server.http, "/metrics").unwrap();
        assert_eq!(status, 200, "{body}");
        fencelock_http::prometheus::value(&body, "fencelock_active_leases").expect("the gauge")
    };
    for args in
        [&["run", "jobs/once", "--ttl", "60s", "--", "true"][..], &["elect", "leader", "--ttl", "60s", "--", "true"]]
    {
        let out = Command::new(bin()).args(args).env("FENCELOCK_SERVER", server.url()).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", support::stderr(&out));
        assert_eq!(active(), 0, "a lease outlived `fencelock {}`", args[0]);
    }
}
