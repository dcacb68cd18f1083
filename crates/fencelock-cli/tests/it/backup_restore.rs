//! Backup and restore (issue 14, part 5): `fencelock snapshot save` takes a
//! consistent backup from a running node; `fencelock snapshot restore` builds a
//! new data dir from it whose group grants nothing the old one held and whose
//! tokens start above every token the old group issued, even after the backup
//! (INV-2: tokens never go backwards at the fences, across a restore too).
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{cli, stderr, stdout, Server};

fn fencelock(args: &[&str]) -> Output {
    Command::new(support::bin()).args(args).output().expect("run fencelock")
}

/// SIGTERM, and wait until it has exited (it closes its database cleanly).
fn stop_cleanly(server: &mut Server) {
    let term = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(term.success());
    let start = std::time::Instant::now();
    while server.is_running() {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "the server did not stop on SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn acquire_token(server: &Server, name: &str) -> u64 {
    let out = cli(server, &["acquire", name, "--ttl", "60s", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["token"].as_u64().unwrap()
}

#[test]
fn inv2_a_restored_group_holds_nothing_and_issues_tokens_above_the_old_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Server::start(&tmp.path().join("old"));
    let before: Vec<u64> = ["a", "b", "c"].iter().map(|n| acquire_token(&server, n)).collect();
    let file = tmp.path().join("backup.json");
    let admin = server.http.to_string();
    let out = fencelock(&["snapshot", "save", file.to_str().unwrap(), "--admin", &admin]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("3 held locks"), "{}", stdout(&out));
    // The old group goes on after the backup: these tokens are not in it.
    let after = acquire_token(&server, "d");
    assert!(after > before[2]);
    // A backup never overwrites a file.
    let again = fencelock(&["snapshot", "save", file.to_str().unwrap(), "--admin", &admin]);
    assert!(!again.status.success() && stderr(&again).contains("never overwrites"), "{again:?}");
    server.kill();

    let new_dir = tmp.path().join("new");
    let out = fencelock(&["snapshot", "restore", file.to_str().unwrap(), "--data-dir", new_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("dropped 3 leases and 3 held locks"), "{}", stdout(&out));
    let restored = Server::start_with_data(&tmp.path().join("restored-logs"), &new_dir);
    let locks = cli(&restored, &["locks", "--json"]);
    assert!(locks.status.success(), "{locks:?}");
    assert!(!stdout(&locks).contains("\"a\""), "no old holder is live: {}", stdout(&locks));
    let first = acquire_token(&restored, "a");
    assert!(first > after, "INV-2: the restored group's first token {first} is not above {after}");
    assert!(acquire_token(&restored, "e") > first);
}

#[test]
fn restore_refuses_a_used_dir_a_foreign_file_and_an_unknown_version() {
    let tmp = tempfile::tempdir().unwrap();
    let used = tmp.path().join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("something"), b"x").unwrap();
    let good = serde_json::json!({"format": "fencelock-backup", "version": 1, "node_id": 1,
        "last_applied_index": null, "last_token": 0, "engine": {"now": 0, "next_lease_id": 1, "next_token": 1,
        "leases": {}, "grant_reqs": {}, "revoked": [], "locks": {}, "timers": []}});
    let cases = [
        (good.clone(), used.clone(), "is not empty"),
        (serde_json::json!({"hello": 1}), tmp.path().join("n1"), "not a fencelock backup"),
        (
            {
                let mut v = good.clone();
                v["version"] = 99.into();
                v
            },
            tmp.path().join("n2"),
            "version 99 is not one this binary reads",
        ),
    ];
    for (i, (doc, dir, why)) in cases.into_iter().enumerate() {
        let file = tmp.path().join(format!("b{i}.json"));
        std::fs::write(&file, doc.to_string()).unwrap();
        let out = fencelock(&["snapshot", "restore", file.to_str().unwrap(), "--data-dir", dir.to_str().unwrap()]);
        assert!(!out.status.success(), "case {i}: {out:?}");
        assert!(stderr(&out).contains(why), "case {i}: {}", stderr(&out));
    }
    assert!(!tmp.path().join("n1").exists() && !tmp.path().join("n2").exists(), "a refused restore writes nothing");
}

/// `fencelock check-data` passes a stopped server's data dir and names the
/// record when one byte of a log entry is changed: on the segment log (the
/// default) the segment and the offset, the changed entry followed by another
/// (a changed last record would be a torn write, cut at start-up).
#[test]
fn check_data_passes_a_real_dir_and_names_a_corrupt_record() {
    let tmp = tempfile::tempdir().unwrap();
    let data = stopped_with_locks(tmp.path(), &[], &["checked", "after"]);
    let segment = data.join("wal").join(format!("{:020}.seg", 0));
    flip_first(&segment, b"checked");
    let bad = fencelock(&["check-data", data.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(stderr(&bad).contains(&format!("{:020}.seg", 0)) && stderr(&bad).contains("offset"), "{}", stderr(&bad));
}

/// The same with the log in redb (`--log-engine redb`): the record is named
/// by its table and index.
#[test]
fn check_data_on_the_redb_log_names_a_corrupt_record() {
    let tmp = tempfile::tempdir().unwrap();
    let data = stopped_with_locks(tmp.path(), &["--log-engine", "redb"], &["checked"]);
    flip_first(&data.join("fencelock.redb"), b"checked");
    let bad = fencelock(&["check-data", data.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(stderr(&bad).contains("corrupt record raft_log["), "{}", stderr(&bad));
}

/// A server's data dir (`flags` given to it) after `locks` were taken and it
/// stopped; `fencelock check-data` passes it.
fn stopped_with_locks(dir: &Path, flags: &[&str], locks: &[&str]) -> PathBuf {
    let mut server = Server::start_with_flags(dir, flags, None);
    for lock in locks {
        acquire_token(&server, lock);
    }
    stop_cleanly(&mut server);
    let data = dir.join("data");
    let ok = fencelock(&["check-data", data.to_str().unwrap()]);
    assert!(ok.status.success(), "{ok:?}");
    assert!(stdout(&ok).contains(&format!("{} held locks", locks.len())), "{}", stdout(&ok));
    data
}

/// Changes the first byte of the first `needle` in `file`.
fn flip_first(file: &Path, needle: &[u8]) {
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("the name is in the file");
    bytes[at] ^= 0x20;
    std::fs::write(file, bytes).unwrap();
}
