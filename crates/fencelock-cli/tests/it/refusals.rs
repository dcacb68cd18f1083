//! Issue 36 end to end, with real processes: a holder whose lease ran out
//! (it could not renew it: paused, partitioned) writes late to `fencelock
//! storage --report-to`, the storage server refuses the stale write (409),
//! and `fencelock watch` shows it as `write_refused` on the lock the request
//! named, with the refused token and the highest.
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::Cluster;
use support::{bin, fencelock_at, free_port, http_get, http_request, stdout, Server};

/// Upper bound of every wait; only reached when the test fails.
const WAIT: Duration = Duration::from_secs(30);

/// A child killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fencelock storage` on a free port, reporting to `server` (a URL, or a
/// list of a group's); its stderr in `dir/storage.log`.
fn storage_reporting_to(dir: &Path, server: &str) -> (Killed, SocketAddr) {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = Command::new(bin())
        .args(["storage", "--data-dir"])
        .arg(dir.join("storage"))
        .args(["--listen", &addr.to_string(), "--report-to", server])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("storage.log")).unwrap())
        .spawn()
        .expect("spawn fencelock storage");
    let child = Killed(child);
    let start = Instant::now();
    while !matches!(http_get(addr, "/healthz"), Ok((200, _))) {
        let log = std::fs::read_to_string(dir.join("storage.log")).unwrap_or_default();
        assert!(start.elapsed() < WAIT, "storage server not healthy: {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

/// `fencelock watch LOCK --from 0 [ARGS…]` against `server` (a URL); its
/// lines, as they come.
fn watch(server: &str, lock: &str, args: &[&str]) -> (Killed, mpsc::Receiver<String>) {
    let mut child = Command::new(bin())
        .args(["watch", lock, "--from", "0", "--server", server])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run fencelock watch");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (Killed(child), rx)
}

/// The first line of `lines` that `pick` takes, within [`WAIT`].
fn first(lines: &mpsc::Receiver<String>, what: &str, pick: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).unwrap_or_else(|_| panic!("no {what}; printed:\n{}", seen.join("\n")));
        if pick(&line) {
            return line;
        }
        seen.push(line);
    }
}

/// `fencelock acquire LOCK --json ARGS…` against `server` (a URL, or a
/// group's list): the grant's token.
fn acquire(server: &str, lock: &str, args: &[&str]) -> u64 {
    let out = fencelock_at(server, None, &[&["acquire", lock, "--json"], args].concat());
    assert!(out.status.success(), "acquire {lock} {args:?}: {out:?}");
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["token"].as_u64().unwrap_or_else(|| panic!("no token in {v}"))
}

/// `PUT /objects/{key}` with the fencing headers: the status.
fn put(storage: SocketAddr, key: &str, lock: &str, token: u64) -> u16 {
    let headers = [("Fencing-Lock", lock.to_string()), ("Fencing-Token", token.to_string())];
    let (status, body) = http_request(storage, "PUT", &format!("/objects/{key}"), &headers, b"v").expect("PUT");
    assert!(status == 409 || status < 300, "{status} {body}");
    status
}

/// Rule (issue 36): a stale write that `fencelock storage --report-to`
/// refuses (the holder's lease expired, a newer holder wrote) reaches the
/// lock service: `fencelock watch --json` prints one `write_refused` event
/// of the lock named in `Fencing-Lock`, with the refused token, the highest
/// the fence had admitted, the object key, and no lease; the text form says
/// the same. The newer holder's write is not reported.
#[test]
fn a_stale_write_refused_by_storage_is_seen_by_fencelock_watch() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("lock"));
    let url = server.url();
    let (_storage, addr) = storage_reporting_to(tmp.path(), &url);
    let (_json, json_lines) = watch(&url, "reports/", &["--json"]);
    let (_text, text_lines) = watch(&url, "reports/", &[]);

    // Holder A takes the lock on a lease nobody renews (A is paused), and
    // holder B gets it once that lease has expired, with a larger token.
    let a = acquire(&url, "reports/daily", &["--ttl", "1s"]);
    let b = acquire(&url, "reports/daily", &["--ttl", "30s", "--wait", "20s"]);
    assert!(b > a, "B's token {b} must be above A's {a}");
    assert_eq!(put(addr, "daily-csv", "reports/daily", b), 201, "B writes");
    assert_eq!(put(addr, "daily-csv", "reports/daily", a), 409, "A wakes up and writes late: refused");

    let is_refused = |l: &str| l.contains("write_refused");
    let line = first(&json_lines, "write_refused event", is_refused);
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let got = (&v["kind"], &v["lock"], &v["token"], &v["highest_token"], &v["resource"], &v["lease_id"]);
    let want = ("write_refused", "reports/daily", a, b, "daily-csv", 0);
    assert_eq!(got, (&want.0.into(), &want.1.into(), &want.2.into(), &want.3.into(), &want.4.into(), &want.5.into()));
    let text = first(&text_lines, "write_refused line", is_refused);
    let shown = text.split_once(' ').map(|(_, rest)| rest.to_string()).unwrap_or_default();
    assert_eq!(shown, format!("write_refused reports/daily token={a} highest={b} resource=daily-csv"));

    // Nothing more was reported: a grant after the refusal is the next event
    // the watch prints that is not a grant's end.
    acquire(&url, "reports/zz-end", &["--ttl", "30s"]);
    let next = first(&json_lines, "the end grant", |l| l.contains("reports/zz-end") || is_refused(l));
    assert!(next.contains("\"granted\""), "only one refusal was reported: {next}");
}

/// Rule (issue 36, a 3-node group): a fence that reports to the group, its
/// list naming a follower first, reaches the leader (the client follows the
/// follower's hint), and the one `write_refused` event is in every member's
/// watch, a follower's too.
#[test]
fn a_refusal_reported_to_a_group_is_in_every_members_watch() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start_plain(3);
    let leader = c.must_lead("at the start");
    let follower = (leader + 1) % c.nodes.len();
    let member = |i: usize| format!("http://{}", c.nodes[i].grpc);
    let (_storage, addr) = storage_reporting_to(tmp.path(), &format!("{},{}", member(follower), member(leader)));
    let watches: Vec<_> = (0..c.nodes.len()).map(|i| watch(&member(i), "reports/", &["--json"])).collect();

    let urls = c.urls();
    let a = acquire(&urls, "reports/daily", &["--ttl", "1s"]);
    let b = acquire(&urls, "reports/daily", &["--ttl", "30s", "--wait", "20s"]);
    assert!(b > a, "B's token {b} must be above A's {a}");
    assert_eq!(put(addr, "daily-csv", "reports/daily", b), 201, "B writes");
    assert_eq!(put(addr, "daily-csv", "reports/daily", a), 409, "A writes late: refused");

    for (i, (_child, lines)) in watches.iter().enumerate() {
        let line =
            first(lines, &format!("node {}'s write_refused event", c.nodes[i].id), |l| l.contains("write_refused"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let got = (v["lock"].as_str(), v["token"].as_u64(), v["highest_token"].as_u64(), v["resource"].as_str());
        assert_eq!(got, (Some("reports/daily"), Some(a), Some(b), Some("daily-csv")), "node {}: {line}", c.nodes[i].id);
    }
}
