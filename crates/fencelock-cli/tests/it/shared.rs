//! Issue 18: read-write locks and semaphores from the CLI, end to end through
//! `fencelock serve`: `acquire --shared` twice holds twice; a writer is busy
//! while readers hold; `--permits 2` admits two holders and the third is busy,
//! and another permit count is refused naming both; `fencelock locks` shows
//! every holder with its mode or weight (text and `--json`).
#![allow(clippy::disallowed_methods)]

use crate::support;

use serde_json::Value;
use support::{cli, http_get, stderr, stdout, Server};

/// `fencelock`'s exit code for a busy lock (see `exit.rs`).
const BUSY: i32 = 73;

fn locks_json(server: &Server) -> Value {
    let out = cli(server, &["locks", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn readers_share_from_the_cli_and_a_writer_is_busy_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    for who in ["reader-1", "reader-2"] {
        let out = cli(&server, &["acquire", "report", "--shared", "--ttl", "1h", "--identity", who]);
        assert!(out.status.success(), "{who}: {}", stderr(&out));
    }
    let writer = cli(&server, &["acquire", "report", "--ttl", "1h"]);
    assert_eq!(writer.status.code(), Some(BUSY), "{}", stderr(&writer));
    let lock = &locks_json(&server)["locks"][0];
    let holders = lock["holders"].as_array().unwrap();
    let shown: Vec<_> =
        holders.iter().map(|h| (h["identity"].as_str().unwrap(), h["mode"].as_str().unwrap())).collect();
    assert_eq!(shown, [("reader-1", "shared"), ("reader-2", "shared")]);
    let text = stdout(&cli(&server, &["locks"]));
    assert!(text.contains("  holding: reader-2 (lease ") && text.contains(", shared)"), "{text}");
    let (code, body) = http_get(server.http, "/v1/locks").unwrap();
    assert_eq!(code, 200, "{body}");
    let admin: Value = serde_json::from_str(&body).unwrap();
    let modes: Vec<_> = admin["locks"][0]["holders"].as_array().unwrap().iter().map(|h| h["mode"].clone()).collect();
    assert_eq!(modes, ["shared", "shared"], "{body}");
}

#[test]
fn a_semaphore_of_two_admits_two_holders_from_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    for who in ["w1", "w2"] {
        let out = cli(&server, &["acquire", "pool", "--permits", "2", "--ttl", "1h", "--identity", who]);
        assert!(out.status.success(), "{who}: {}", stderr(&out));
    }
    let third = cli(&server, &["acquire", "pool", "--permits", "2", "--ttl", "1h"]);
    assert_eq!(third.status.code(), Some(BUSY), "{}", stderr(&third));
    let other = cli(&server, &["acquire", "pool", "--permits", "3", "--ttl", "1h"]);
    assert!(!other.status.success());
    let err = stderr(&other);
    assert!(err.contains("has 2 permits") && err.contains("asked for 3"), "{err}");
    let lock = &locks_json(&server)["locks"][0];
    assert_eq!(lock["permits"], 2);
    assert_eq!(lock["holders"].as_array().unwrap().len(), 2);
    let text = stdout(&cli(&server, &["locks"]));
    assert!(text.contains("  semaphore: 2 of 2 permits in use"), "{text}");
    let weight = cli(&server, &["acquire", "pool", "--weight", "2", "--ttl", "1h"]);
    assert!(!weight.status.success(), "--weight without --permits is a usage error");
}

/// `fencelock resize` (issue 18 §2): grows a semaphore (the text says from
/// what), refuses 0, a lock that is not a semaphore, and a number below what
/// its holders use, each with the reason; acquires then name the new number.
#[test]
fn resize_from_the_cli_grows_a_semaphore_and_refuses_what_cannot_be() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let out = cli(&server, &["acquire", "pool", "--permits", "1", "--ttl", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let grown = cli(&server, &["resize", "pool", "2"]);
    assert!(grown.status.success(), "{}", stderr(&grown));
    assert_eq!(stdout(&grown).trim(), "semaphore \"pool\" has 2 permits (was 1)");
    let out = cli(&server, &["acquire", "pool", "--permits", "2", "--ttl", "1h"]);
    assert!(out.status.success(), "the second permit after the resize: {}", stderr(&out));
    for (args, why) in [
        (["resize", "pool", "1"], "cannot resize to 1 permits: 2 are needed"),
        (["resize", "pool", "0"], "cannot resize to 0 permits"),
        (["resize", "nobody", "3"], "is not a semaphore now"),
    ] {
        let out = cli(&server, &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
    }
    let json: Value = serde_json::from_str(&stdout(&cli(&server, &["resize", "pool", "3", "--json"]))).unwrap();
    assert_eq!((json["permits"].as_u64(), json["was"].as_u64()), (Some(3), Some(2)));
}
