//! Issue 17: holder identity and value, end to end through `fencelock serve`.
//! `acquire` sends `hostname:pid` by default (or `--identity`) and `--value`;
//! `fencelock locks` (text and `--json`) and the admin `/v1/locks` show the
//! holder's identity and value (base64 in JSON) and the waiters' identities; an
//! oversized value or a bad identity is refused with a clear error before any
//! log entry is written (`fencelock_log_entries_total` unchanged).
#![allow(clippy::disallowed_methods)]

use crate::support;

use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::{bin, cli, http_get, stderr, stdout, Server};

/// Base64 of `10.0.0.1:7000`.
const VALUE_B64: &str = "MTAuMC4wLjE6NzAwMA==";

fn locks_json(server: &Server) -> Value {
    let out = cli(server, &["locks", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn log_entries(server: &Server) -> u64 {
    let (_, text) = http_get(server.http, "/metrics").unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("fencelock_log_entries_total ")).expect("the counter");
    line.trim().parse().unwrap()
}

/// This machine's hostname as the CLI reads it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

#[test]
fn locks_and_admin_json_show_holder_identity_value_and_waiter_identities() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let args = ["acquire", "elect", "--ttl", "1h", "--identity", "host-a:1", "--value", "10.0.0.1:7000", "--json"];
    let out = cli(&server, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let grant: Value = serde_json::from_str(&stdout(&out)).unwrap();

    // A waiter with the default identity: hostname:pid of its own process.
    let waiter = Command::new(bin())
        .args(["acquire", "elect", "--ttl", "1h", "--wait", "60s", "--json"])
        .env("FENCELOCK_SERVER", server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiter_identity = format!("{}:{}", hostname(), waiter.id());
    let mut locks = locks_json(&server);
    for _ in 0..200 {
        if locks["locks"][0]["waiters"] == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        locks = locks_json(&server);
    }
    let lock = &locks["locks"][0];
    assert_eq!(lock["name"], "elect");
    assert_eq!(lock["holder"]["token"], grant["token"]);
    assert_eq!(lock["holder"]["identity"], "host-a:1");
    assert_eq!(lock["holder"]["value_base64"], VALUE_B64);
    assert_eq!(lock["waiters"], 1);
    assert_eq!(lock["waiting"][0]["identity"], json!(waiter_identity));

    let (code, body) = http_get(server.http, "/v1/locks").unwrap();
    assert_eq!(code, 200, "{body}");
    let admin: Value = serde_json::from_str(&body).unwrap();
    let lock = &admin["locks"][0];
    assert_eq!((&lock["holder"]["identity"], &lock["holder"]["value_base64"]), (&json!("host-a:1"), &json!(VALUE_B64)));
    assert_eq!(lock["waiters"][0]["identity"], json!(waiter_identity));

    let out = cli(&server, &["locks"]);
    let text = stdout(&out);
    assert!(text.contains("host-a:1") && text.contains("10.0.0.1:7000"), "{text}");
    assert!(text.contains(&format!("  waiting: {waiter_identity} (lease ")), "{text}");

    // Released: the waiter becomes the holder, with its own identity and no value.
    let (lease, token) = (grant["lease_id"].to_string(), grant["token"].to_string());
    let out = cli(&server, &["release", "elect", "--lease", &lease, "--token", &token]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = waiter.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    let holder = &locks_json(&server)["locks"][0]["holder"];
    assert_eq!((&holder["identity"], &holder["value_base64"]), (&json!(waiter_identity), &json!("")));
}

#[test]
fn an_oversized_value_or_a_bad_identity_is_refused_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    // The server's own entries (its election) are written before it serves.
    let before = log_entries(&server);
    let big = "v".repeat(4097);
    let cases: &[(&[&str], &str)] = &[
        (&["acquire", "x", "--value", &big], "invalid value: 4097 bytes (must be at most 4096 bytes)"),
        (&["acquire", "x", "--identity", "a\u{7}b"], "invalid identity: must not contain control characters"),
        (&["run", "x", "--value", &big, "--", "true"], "invalid value: 4097 bytes"),
    ];
    for (args, needle) in cases {
        let out = cli(&server, args);
        assert_eq!(out.status.code(), Some(70), "fencelock {args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "fencelock {args:?} stderr should mention {needle:?}: {}", stderr(&out));
    }
    assert_eq!(log_entries(&server), before, "a refused acquire wrote a log entry");
    assert_eq!(locks_json(&server), json!({"locks": []}));
}
