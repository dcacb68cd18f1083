//! `fencelock elect` and `fencelock leader` end to end (issue 17's "done
//! when"): three `elect` processes on one machine run a single active child;
//! when the leader's process is killed, or frozen with its child, another
//! takes over (within the TTL of the leader's lease, which the test bounds
//! generously rather than times), with a greater term; a frozen leader that
//! wakes up finds its leadership lost, stops its child and exits 75.
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{bin, Server};

/// Upper bound of every wait; only reached when a test fails.
const WAIT: Duration = Duration::from_secs(40);

/// One `fencelock elect` candidate whose child writes `TERM PID` to
/// `dir/started-N` and then sleeps.
struct Candidate {
    n: usize,
    process: Child,
    marker: PathBuf,
}

impl Candidate {
    fn start(server: &Server, dir: &Path, n: usize) -> Candidate {
        let marker = dir.join(format!("started-{n}"));
        let script =
            format!("echo \"$FENCELOCK_TERM $$\" > {}.tmp && mv {0}.tmp {0} && exec sleep 600", marker.display());
        let process = Command::new(bin())
            .args(["elect", "svc", "--ttl", "2s", "--kill-grace", "1s", "--server", &server.url()])
            .args(["--value", &format!("candidate-{n}"), "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fencelock elect");
        Candidate { n, process, marker }
    }

    /// `(term, child pid)` once its child started.
    fn started(&self) -> Option<(u64, i32)> {
        let text = std::fs::read_to_string(&self.marker).ok()?;
        let (term, pid) = text.trim().split_once(' ')?;
        Some((term.parse().ok()?, pid.parse().ok()?))
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.process.id() as i32), sig).expect("signal the candidate");
    }
}

/// Waits until exactly one candidate of `among` has started its child, and
/// checks it stays the only one for a moment; returns its index.
fn the_one_leader(among: &[&Candidate]) -> usize {
    let start = Instant::now();
    loop {
        let started: Vec<usize> = (0..among.len()).filter(|&i| among[i].started().is_some()).collect();
        assert!(started.len() <= 1, "two active children: candidates {started:?}");
        if let [i] = started[..] {
            return i;
        }
        assert!(start.elapsed() < WAIT, "no candidate was elected within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fencelock leader svc --json` as JSON.
fn leader(server: &Server) -> serde_json::Value {
    let out = Command::new(bin()).args(["leader", "svc", "--json", "--server", &server.url()]).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

/// Issue 17: one active child among three candidates; kill the leader's
/// process (its child dies with it) and another takes over with a greater
/// term; freeze the next leader with its child and the last takes over; the
/// frozen one, woken, stops its child and exits 75 (leadership lost).
#[test]
fn one_of_three_leads_and_the_others_take_over_when_it_is_killed_or_frozen() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let mut candidates: Vec<Candidate> = (0..3).map(|n| Candidate::start(&server, tmp.path(), n)).collect();

    let all: Vec<&Candidate> = candidates.iter().collect();
    let first = the_one_leader(&all);
    let (term1, child1) = candidates[first].started().unwrap();
    let shown = leader(&server);
    assert_eq!(shown["term"], term1, "{shown}");
    assert_eq!(shown["value"], format!("candidate-{}", candidates[first].n), "{shown}");

    // Killed: the child dies with it (parent-death signal); the lease expires.
    candidates[first].process.kill().unwrap();
    candidates[first].process.wait().unwrap();
    let mut dead = candidates.remove(first);
    let rest: Vec<&Candidate> = candidates.iter().collect();
    let second = the_one_leader(&rest);
    let (term2, child2) = candidates[second].started().unwrap();
    assert!(term2 > term1, "term {term2} after {term1}");
    let start = Instant::now();
    while alive(child1) {
        assert!(start.elapsed() < WAIT, "the killed leader's child outlived it");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Frozen with its child (a paused machine): the last candidate takes over.
    candidates[second].signal(Signal::SIGSTOP);
    kill(Pid::from_raw(child2), Signal::SIGSTOP).unwrap();
    let third = 1 - second;
    let start = Instant::now();
    while candidates[third].started().is_none() {
        assert!(start.elapsed() < WAIT, "nobody took over from the frozen leader");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (term3, _) = candidates[third].started().unwrap();
    assert!(term3 > term2, "term {term3} after {term2}");
    assert_eq!(leader(&server)["term"], term3);

    // Woken: it finds its leadership lost, stops its child, exits 75.
    kill(Pid::from_raw(child2), Signal::SIGCONT).unwrap();
    candidates[second].signal(Signal::SIGCONT);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = candidates[second].process.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < WAIT, "the woken leader did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(75), "the woken leader's exit");
    assert!(!alive(child2), "the woken leader's child was stopped");
    for c in candidates.iter_mut().chain(std::iter::once(&mut dead)) {
        let _ = c.process.kill();
        let _ = c.process.wait();
    }
}

/// `fencelock leader` exits 1 with "no leader" when nobody leads; `--watch`
/// prints the current leader first, then its vacancy when the elected command
/// exits (the candidate resigns), as JSON lines; `elect` passes the child's
/// exit code through.
#[test]
fn leader_shows_none_then_follows_an_election() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let out = Command::new(bin()).args(["leader", "svc", "--server", &server.url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no leader svc");

    let stop = tmp.path().join("stop");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done; exit 3", stop.display());
    let mut elect = Command::new(bin())
        .args(["elect", "svc", "--value", "v1", "--server", &server.url(), "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while leader(&server)["event"] != "leader" {
        assert!(start.elapsed() < WAIT, "not elected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut watcher = Command::new(bin())
        .args(["leader", "svc", "--watch", "--json", "--server", &server.url()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watcher.stdout.take().unwrap()));
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!((first["event"].as_str(), first["value"].as_str()), (Some("leader"), Some("v1")), "{first}");
    std::fs::write(&stop, b"").unwrap();
    assert_eq!(elect.wait().unwrap().code(), Some(3), "the child's exit code");
    let second: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(second["event"], "vacant", "{second}");
    assert_eq!(second["term"], first["term"], "{second}");
    let _ = watcher.kill();
    let _ = watcher.wait();
}
