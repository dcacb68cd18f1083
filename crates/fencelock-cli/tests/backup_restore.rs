//! Backup and restore (issue 14, part 5): `fencelock snapshot save` takes a
//! consistent backup from a running node; `fencelock snapshot restore` builds a
//! new data dir from it whose group grants nothing the old one held and whose
//! tokens start above every token the old group issued, even after the backup
//! (INV-2: tokens never go backwards at the fences, across a restore too).

mod support;

use std::process::{Command, Output};

use support::{cli, stderr, stdout, Server};

fn fencelock(args: &[&str]) -> Output {
    Command::new(support::bin()).args(args).output().expect("run fencelock")
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
        "last_applied_index": null, "tokens_issued": 0, "engine": {"now": 0, "next_lease_id": 1, "next_token": 1,
        "leases": {}, "grant_reqs": {}, "revoked": [], "locks": {}, "timers": []}});
    let cases = [
        (good.clone(), used.clone(), "is not empty"),
        (serde_json::json!({"hello": 1}), tmp.path().join("n1"), "not a fencelock backup"),
        ({ let mut v = good.clone(); v["version"] = 99.into(); v }, tmp.path().join("n2"), "version 99 is not one this binary reads"),
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
