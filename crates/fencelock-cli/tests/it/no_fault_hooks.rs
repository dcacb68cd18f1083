//! Issue 16, part 3: the `fencelock` binary has no fault hooks, however it is
//! built. This test runs the binary the other CLI tests run, which cargo builds
//! with the features of the whole workspace unified (the chaos harness's
//! dependencies included): the fault variables of `fencelock-chaos serve` must
//! change nothing, and none of the code that reads them may be in the binary.

use crate::support;

use std::time::Duration;

use support::{bin, cli, http_get, stdout, Server};

/// Every variable `fencelock-chaos serve` arms a fault from.
const FAULT_VARS: [&str; 5] =
    ["FENCELOCK_FAULT_CLOCK", "FENCELOCK_POWER_LOSS_SHIM", "FENCELOCK_MUTANT", "FAILPOINTS", "FENCELOCK_PEER_ROUTES"];

/// The strong check: the binary's bytes do not hold the variables' names, so
/// no code that reads them was linked in.
#[test]
fn the_binary_holds_no_fault_variable() {
    let bytes = std::fs::read(bin()).expect("read the fencelock binary");
    let found = occurring(&bytes, &FAULT_VARS);
    assert!(found.is_empty(), "the fencelock binary {} contains {found:?}: fault code is linked in", bin());
}

/// The words of `words` (each starting with `F`) that occur in `bytes`, in one
/// pass over the binary.
fn occurring<'a>(bytes: &[u8], words: &[&'a str]) -> Vec<&'a str> {
    assert!(words.iter().all(|w| w.starts_with('F')));
    let mut found = Vec::new();
    for (at, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'F') {
        for w in words.iter().filter(|w| bytes[at..].starts_with(w.as_bytes())) {
            if !found.contains(w) {
                found.push(*w);
            }
        }
    }
    found
}

/// Acquires `lock` with a 30 s TTL: (lease, token).
fn acquire(server: &Server, lock: &str) -> (String, String) {
    let out = cli(server, &["acquire", lock, "--ttl", "30s", "--json"]);
    assert!(out.status.success(), "acquire {lock}: {out:?}\nlog:\n{}", server.log_text());
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    (v["lease_id"].to_string(), v["token"].to_string())
}

/// The TTL the server has left for `lock`'s holder.
fn ttl_left(server: &Server, lock: &str) -> u64 {
    let (code, body) = http_get(server.http, &format!("/v1/locks/{lock}")).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["holder"]["ttl_left_ms"].as_u64().unwrap_or_else(|| panic!("{lock} is not held: {body}"))
}

/// Started with every fault variable set (a fault clock 1000 times fast that
/// has jumped 10 minutes, crash points that would abort at once, the power-loss
/// shim, both mutants, a peer route to nowhere), the server behaves as without
/// them: it grants and releases, does not abort, lets a 30 s lease live, keeps
/// tokens going up across a restart, journals nothing, and logs no fault.
#[test]
fn fault_variables_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = tmp.path().join("clock");
    std::fs::write(&clock, "rate=1000 jump_ms=600000\n").unwrap();
    let failpoints = "log-before-fsync=return;log-after-fsync=return;reply-before-send=return;sm-before-apply=return";
    let env = [
        ("FENCELOCK_FAULT_CLOCK", clock.to_str().unwrap()),
        ("FENCELOCK_POWER_LOSS_SHIM", "1"),
        ("FAILPOINTS", failpoints),
        ("FENCELOCK_MUTANT", "memory-token,dead-waiter"),
        ("FENCELOCK_PEER_ROUTES", "1=127.0.0.1:1,2=127.0.0.1:1"),
    ];
    let mut server = Server::start_with_env(&tmp.path().join("node"), &env);

    let (lease, token) = acquire(&server, "a");
    std::thread::sleep(Duration::from_millis(1500));
    let left = ttl_left(&server, "a");
    assert!(left > 25_000, "a 30 s lease has {left} ms left after 1.5 s: the clock is not the real one");
    let out = cli(&server, &["release", "a", "--lease", &lease, "--token", &token]);
    assert!(out.status.success(), "release: {out:?}");
    assert!(server.is_running(), "the server exited (a crash point fired?):\n{}", server.log_text());
    let undo = server.data.join("fencelock.redb.undo");
    assert!(!undo.exists(), "the power-loss shim journaled writes into {}", undo.display());

    server.restart();
    let (_, after) = acquire(&server, "b");
    let (before, after): (u64, u64) = (token.parse().unwrap(), after.parse().unwrap());
    assert!(after > before, "token {after} after the restart, {before} before: tokens must keep going up");
    assert!(server.is_running(), "the server exited after the restart:\n{}", server.log_text());

    let log = server.log_text().to_lowercase();
    for word in ["fault clock", "fault armed", "mutant", "failpoint", "power-loss", "test-only"] {
        assert!(!log.contains(word), "the server's log mentions {word:?}:\n{log}");
    }
}
