//! Issue 14, part 3: the data dir has an identity. Each test starts the real
//! binary and checks one finding:
//! - a data dir that exists but holds no node's data (empty, no database, a
//!   zero-byte database) is refused instead of silently starting a new group at
//!   token 1; `--force-new-cluster` starts one deliberately;
//! - a wrong `--node-id` on existing data is refused (it used to make the node a
//!   learner that never served, with no error);
//! - a data dir deleted under a running server stops it (fail closed) instead of
//!   acknowledging grants it can no longer keep;
//! - a new group's tokens start above an earlier group's (INV-2 across groups,
//!   the token floor);
//! - `--peers` on a node with data is named in a warning, or refused when it
//!   contradicts the stored membership; a `--peers` entry that is not the
//!   node's address and `--listen 0.0.0.0` without `--advertise` are errors.
// Tests wait for processes by the clock; no lease logic lives here.
#![allow(clippy::disallowed_methods)]

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{bin, free_port, http_get};

/// A `fencelock serve` started with `args` after `--data-dir DATA`, its stderr
/// in `log`. Killed on drop.
struct Serve {
    child: Child,
    log: std::path::PathBuf,
    grpc: SocketAddr,
    http: SocketAddr,
}

impl Serve {
    fn start(dir: &Path, data: &Path, args: &[&str]) -> Serve {
        Serve::start_on(dir, data, free_addr(), args)
    }

    fn start_on(dir: &Path, data: &Path, grpc: SocketAddr, args: &[&str]) -> Serve {
        let http = free_addr();
        let log = dir.join(format!("serve-{}.log", free_port()));
        let child = Command::new(bin())
            .args(["serve", "--data-dir"])
            .arg(data)
            .args(["--listen", &grpc.to_string(), "--http", &http.to_string()])
            .args(args)
            .env("FENCELOCK_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn fencelock serve");
        Serve { child, log, grpc, http }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most 20 s) until `/healthz` answers 200.
    fn healthy(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok((200, _)) = http_get(self.http, "/healthz") {
                return true;
            }
            if !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits (at most 20 s) for the process to exit by itself; its exit code.
    fn exited(&mut self) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `fencelock acquire NAME --json` against this server: the token, or the
    /// exit code and stderr.
    fn acquire(&self, name: &str) -> Result<u64, (Option<i32>, String)> {
        let out = Command::new(bin())
            .args(["acquire", name, "--ttl", "60s", "--json"])
            .env("FENCELOCK_SERVER", format!("http://{}", self.grpc))
            .output()
            .expect("run fencelock acquire");
        if !out.status.success() {
            return Err((out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned()));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        Ok(v["token"].as_u64().expect("a token"))
    }

    /// The lease and token holding `name`, from `GET /v1/locks/{name}`
    /// (`(0, 0)`: free).
    fn holder(&self, name: &str) -> (u64, u64) {
        let (code, body) = http_get(self.http, &format!("/v1/locks/{name}")).expect("GET /v1/locks");
        assert_eq!(code, 200, "{body}");
        let lock: serde_json::Value = serde_json::from_str(&body).expect("json");
        let field = |f: &str| crate::support::id(&lock["holder"][f]).unwrap_or(0);
        (field("lease_id"), field("token"))
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Starts `serve` with `args` and expects it to refuse to start: exit non-zero
/// with `needle` in its output, having written no database.
fn assert_refused(dir: &Path, data: &Path, args: &[&str], needle: &str) -> String {
    let mut s = Serve::start(dir, data, args);
    let code = s.exited();
    let log = s.log();
    assert!(code.is_some_and(|c| c != 0), "must refuse to start (exit {code:?}); log:\n{log}");
    assert!(log.contains(needle), "the refusal should say {needle:?}:\n{log}");
    log
}

#[test]
fn a_first_start_creates_the_data_dir_and_says_so_on_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Serve::start(tmp.path(), &data, &[]);
    assert!(s.healthy(), "{}", s.log());
    let log = s.log();
    let line =
        log.lines().find(|l| l.contains("new data dir")).unwrap_or_else(|| panic!("no first-start line:\n{log}"));
    assert!(line.contains("forms a new group, cluster id"), "{line}");
    s.kill();
    // A restart on the same data is not a first start.
    let mut s = Serve::start(tmp.path(), &data, &[]);
    assert!(s.healthy(), "{}", s.log());
    assert!(!s.log().contains("new data dir"), "{}", s.log());
}

#[test]
fn an_existing_empty_data_dir_is_refused_and_force_new_cluster_starts_a_group_there() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    assert_refused(tmp.path(), &data, &[], "exists but is empty");
    assert!(!data.join("fencelock.redb").exists(), "nothing was written");
    let mut s = Serve::start(tmp.path(), &data, &["--force-new-cluster"]);
    assert!(s.healthy(), "{}", s.log());
    assert!(s.acquire("a").is_ok());
}

#[test]
fn a_data_dir_without_its_database_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "not a database").unwrap();
    assert_refused(tmp.path(), &data, &[], "has no database fencelock.redb");
}

#[test]
fn a_zero_byte_database_is_refused_and_force_new_cluster_moves_it_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("fencelock.redb"), b"").unwrap();
    assert_refused(tmp.path(), &data, &[], "is empty (zero bytes)");
    assert_eq!(std::fs::metadata(data.join("fencelock.redb")).unwrap().len(), 0, "left as it was");
    let mut s = Serve::start(tmp.path(), &data, &["--force-new-cluster"]);
    assert!(s.healthy(), "{}", s.log());
    assert!(data.join("fencelock.redb.set-aside-1").exists(), "moved aside, not deleted");
}

#[test]
fn a_wrong_node_id_on_existing_data_is_refused_saying_whose_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Serve::start(tmp.path(), &data, &["--log-engine", "redb"]);
    assert!(s.healthy(), "{}", s.log());
    s.kill();
    let log = assert_refused(tmp.path(), &data, &["--node-id", "2", "--log-engine", "redb"], "belongs to node 1");
    assert!(log.contains("--node-id 1"), "says how to proceed:\n{log}");
    // On the default engine, refused before anything changes: its redb log
    // is not moved into segments.
    assert_refused(tmp.path(), &data, &["--node-id", "2"], "belongs to node 1");
    assert!(!data.join("wal").exists() && !data.join("wal.migrating").exists(), "the log was moved");
    let mut s = Serve::start(tmp.path(), &data, &["--log-engine", "redb"]);
    assert!(s.healthy(), "still a redb data dir of node 1:\n{}", s.log());
}

/// Upgrading (issue 19 §2): a data dir whose Raft log is in redb (as every
/// data dir before the segment log was), started with no `--log-engine`,
/// moves its log into `wal/` on that start, says so, and goes on from where
/// it was: its held lock is held by the same lease under the same token, and
/// the next token is above every earlier one (INV-2).
#[test]
fn a_redb_data_dir_started_without_a_log_engine_moves_its_log_and_keeps_its_locks() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Serve::start(tmp.path(), &data, &["--log-engine", "redb"]);
    assert!(s.healthy(), "{}", s.log());
    let tokens: Vec<u64> = ["a", "b", "held"].iter().map(|name| s.acquire(name).unwrap()).collect();
    let held = s.holder("held");
    assert_eq!(held.1, tokens[2], "{held:?}");
    s.kill();
    assert!(!data.join("wal").exists(), "the log is in redb");

    let mut s = Serve::start(tmp.path(), &data, &[]);
    assert!(s.healthy(), "{}", s.log());
    assert!(s.log().contains("moved the Raft log from redb"), "says it moved the log:\n{}", s.log());
    assert!(has_segments(&data.join("wal")), "the log is in wal/");
    assert_eq!(s.holder("held"), held, "the lock is still held by its lease, under its token");
    let next = s.acquire("after-the-move").unwrap();
    assert!(next > tokens[2], "INV-2 across the move: {next} after {tokens:?}");
    s.kill();
    // The move is one way: the redb engine now refuses the data dir.
    assert_refused(tmp.path(), &data, &["--log-engine", "redb"], "keeps its Raft log in segments");
}

/// Whether `dir` holds a segment file of the segment log.
fn has_segments(dir: &Path) -> bool {
    let listed = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).collect::<Vec<_>>()).unwrap_or_default();
    listed.iter().any(|e| e.path().extension().is_some_and(|x| x == "seg"))
}

#[test]
fn a_data_dir_deleted_under_a_running_server_stops_it_instead_of_granting() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Serve::start(tmp.path(), &data, &[]);
    assert!(s.healthy(), "{}", s.log());
    assert!(s.acquire("before").is_ok());
    std::fs::remove_dir_all(&data).unwrap();
    let code = s.exited();
    let log = s.log();
    assert!(code.is_some_and(|c| c != 0), "the server must stop (exit {code:?}):\n{log}");
    assert!(log.contains("is gone while the server ran"), "the server says why:\n{log}");
    match s.acquire("after") {
        Err((code, err)) => assert_eq!(code, Some(70), "{err}"),
        Ok(token) => panic!("granted token {token} from a deleted data dir:\n{log}"),
    }
}

#[test]
fn inv2_a_new_group_issues_tokens_above_an_earlier_groups_on_this_machine() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Serve::start(tmp.path(), &tmp.path().join("one"), &[]);
    assert!(first.healthy(), "{}", first.log());
    let earlier = first.acquire("a").unwrap();
    let issued_at = unix_seconds();
    first.kill();
    // The rule's assumption: the new group starts in a later wall-clock second
    // than the earlier group's leader (see docs/design.md, "Tokens across groups").
    while unix_seconds() == issued_at {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut second = Serve::start(tmp.path(), &tmp.path().join("two"), &[]);
    assert!(second.healthy(), "{}", second.log());
    let later = second.acquire("a").unwrap();
    assert!(later > earlier, "INV-2: the new group's first token {later} is not above the earlier group's {earlier}");
}

fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn peers_on_a_node_with_data_is_named_when_it_differs_and_refused_when_it_contradicts() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let grpc = free_addr();
    let mut s = Serve::start_on(tmp.path(), &data, grpc, &[]);
    assert!(s.healthy(), "{}", s.log());
    s.kill();
    // The same membership: a restart with the flags it was formed with.
    let same = format!("1={grpc}");
    let mut s = Serve::start_on(tmp.path(), &data, grpc, &["--peers", &same]);
    assert!(s.healthy(), "{}", s.log());
    assert!(!s.log().contains("--peers"), "nothing to say:\n{}", s.log());
    s.kill();
    // Another member listed: served from the stored membership, and said so.
    let more = format!("1={grpc},2={}", free_addr());
    let mut s = Serve::start_on(tmp.path(), &data, grpc, &["--peers", &more]);
    assert!(s.healthy(), "{}", s.log());
    assert!(s.log().contains("differs from the membership"), "{}", s.log());
    s.kill();
    // No member in common: another group's data dir.
    let other = free_addr().to_string();
    let peers = format!("1={other}");
    let args = ["--peers", &peers, "--advertise", &other];
    let mut s = Serve::start_on(tmp.path(), &data, grpc, &args);
    let code = s.exited();
    assert!(code.is_some_and(|c| c != 0), "must refuse (exit {code:?}):\n{}", s.log());
    assert!(s.log().contains("no member in common"), "{}", s.log());
}

#[test]
fn a_peers_entry_that_is_not_the_nodes_address_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let peers = format!("1={},2={}", free_addr(), free_addr());
    assert_refused(tmp.path(), &data, &["--peers", &peers], "is not its --listen address");
    assert!(!data.exists(), "nothing was created");
}

#[test]
fn a_wildcard_listen_address_without_advertise_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let wildcard = SocketAddr::from(([0, 0, 0, 0], free_port()));
    let mut s = Serve::start_on(tmp.path(), &data, wildcard, &[]);
    let code = s.exited();
    assert!(code.is_some_and(|c| c != 0), "must refuse (exit {code:?}):\n{}", s.log());
    assert!(s.log().contains("set --advertise"), "{}", s.log());
    assert!(!data.exists(), "nothing was created");
    let advertise = format!("127.0.0.1:{}", wildcard.port());
    // A wildcard is reachable from other hosts: plaintext there needs --insecure.
    let mut s = Serve::start_on(tmp.path(), &data, wildcard, &["--advertise", &advertise, "--insecure"]);
    assert!(s.healthy(), "with --advertise it serves:\n{}", s.log());
}
