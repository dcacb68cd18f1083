//! Every client command takes the server list that `Client::connect` takes,
//! and moves past a listed server that is down (issue 16: `acquire`,
//! `release`, `locks` and `check` used the first listed host only and exited 70
//! `cannot connect` when it was down; `http://a,http://b` was refused with
//! `bad port ""`).

use crate::support;

use std::process::Output;

use support::{free_port, stdout, Server};

/// `fencelock ARGS…` with `FENCELOCK_SERVER` set to `servers`.
fn cli_with(servers: &str, args: &[&str]) -> Output {
    std::process::Command::new(support::bin())
        .args(args)
        .env("FENCELOCK_SERVER", servers)
        .output()
        .expect("run fencelock")
}

fn ok_json(servers: &str, args: &[&str]) -> serde_json::Value {
    let out = cli_with(servers, args);
    assert!(out.status.success(), "fencelock {args:?} with {servers}: {out:?}");
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// Each command, with the first listed server down, in both spellings of a list.
#[test]
fn every_command_moves_past_a_dead_first_server() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let dead = format!("127.0.0.1:{}", free_port());
    let live = server.grpc.to_string();
    for servers in [format!("fencelock://{dead},{live}"), format!("http://{dead},http://{live}")] {
        let grant = ok_json(&servers, &["acquire", "listed", "--ttl", "30s", "--json"]);
        assert_eq!(grant["outcome"], "acquired", "{grant}");
        let token = grant["token"].as_u64().unwrap().to_string();
        let lease = grant["lease_id"].as_u64().unwrap().to_string();

        let check = ok_json(&servers, &["check", "listed", &token, "--json"]);
        assert_eq!(check["current"], true, "{check}");
        let locks = ok_json(&servers, &["locks", "--json"]);
        assert!(locks.to_string().contains("listed"), "{locks}");
        let released = ok_json(&servers, &["release", "listed", "--lease", &lease, "--token", &token, "--json"]);
        assert_eq!(released["released"], true, "{released}");
    }
}

/// A list that mixes schemes is refused with the reason.
#[test]
fn a_list_mixing_schemes_is_refused() {
    let out = cli_with("fencelock://127.0.0.1:1,redis://127.0.0.1:2", &["locks"]);
    assert!(!out.status.success());
    let err = support::stderr(&out);
    assert!(err.contains("one scheme, not both fencelock and redis"), "{err}");
}
