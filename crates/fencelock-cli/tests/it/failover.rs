//! Every client command against a 3-node group of real `fencelock serve`
//! processes whose first listed member is down (issue 16: with
//! `FENCELOCK_SERVER=fencelock://a:7070,b:7070,c:7070` and `a` down, even a
//! follower, `acquire`, `release`, `locks` and `check` exited 70 `cannot
//! connect: http://a:7070`: they dialled the first host only). In both
//! spellings of a list, plaintext, and with TLS and a bearer token given by
//! flags or in the URL.
//!
//! Invariants: INV-2 (the token `run` gets is above the one released before
//! it), INV-5 (release is compare-and-delete: `check` of a released token says
//! stale).
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::{bin, free_port, stderr, stdout};

/// `fencelock ARGS…` with `FENCELOCK_SERVER=servers` and the environment
/// `env`, nothing else of ours inherited.
fn fencelock(servers: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).env("FENCELOCK_SERVER", servers);
    for var in ["FENCELOCK_AUTH_TOKEN", "FENCELOCK_TLS_CA", "FENCELOCK_TLS_CERT", "FENCELOCK_TLS_KEY"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied()).output().expect("run fencelock")
}

fn json_of(out: &Output, what: &str) -> serde_json::Value {
    assert!(out.status.success(), "{what}: exit {:?}: {}", out.status.code(), stderr(out));
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{what}: {e}: {}", stdout(out)))
}

/// acquire → check → locks → release → check again → run, each its own
/// process, through `servers` (+ `args` after every command's own, + `env`).
fn every_command(servers: &str, env: &[(&str, &str)], args: &[&str], lock: &str) {
    let cmd = |head: &[&str]| fencelock(servers, env, &[head, args].concat());
    let what = |c: &str| format!("{c} via {servers}");

    let grant = json_of(&cmd(&["acquire", lock, "--ttl", "60s", "--wait", "10s", "--json"]), &what("acquire"));
    assert_eq!(grant["outcome"], "acquired", "{grant}");
    let token = grant["token"].as_u64().expect("token").to_string();
    let lease = grant["lease_id"].as_u64().expect("lease").to_string();

    let check = json_of(&cmd(&["check", lock, &token, "--json"]), &what("check"));
    assert_eq!(check["current"], true, "{check}");
    let locks = json_of(&cmd(&["locks", "--json"]), &what("locks"));
    let held = locks["locks"].as_array().expect("locks").iter().find(|l| l["name"] == lock).cloned();
    assert_eq!(held.map(|l| l["holder"]["token"].to_string()), Some(token.clone()), "{locks}");
    let released = json_of(&cmd(&["release", lock, "--lease", &lease, "--token", &token, "--json"]), &what("release"));
    assert_eq!(released["released"], true, "{released}");
    let stale = cmd(&["check", lock, &token]);
    assert_eq!(stale.status.code(), Some(1), "{}: {}", what("check after release"), stderr(&stale));

    let child = ["--", "sh", "-c", "echo \"$FENCELOCK_TOKEN\""];
    let run = fencelock(servers, env, &[&["run", lock, "--ttl", "10s", "--wait", "10s"], args, &child].concat());
    assert!(run.status.success(), "{}: exit {:?}: {}", what("run"), run.status.code(), stderr(&run));
    let ran: u64 =
        stdout(&run).trim().parse().unwrap_or_else(|e| panic!("run's child printed no token ({e}): {run:?}"));
    assert!(ran > token.parse::<u64>().unwrap(), "run got token {ran} after {token}");
}

/// Every address of `c`, the node at `first` listed first.
fn listed_first(c: &Cluster, first: usize) -> Vec<SocketAddr> {
    let mut order = vec![c.nodes[first].grpc];
    order.extend(c.nodes.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, n)| n.grpc));
    order
}

/// `fencelock://a,b,c` and `http://a,http://b,http://c`.
fn both_spellings(addrs: &[SocketAddr]) -> [String; 2] {
    let join = |prefix: &str| addrs.iter().map(|a| format!("{prefix}{a}")).collect::<Vec<_>>().join(",");
    [format!("fencelock://{}", join("")), join("http://")]
}

/// The CA (`FENCELOCK_TLS_CA`, which turns TLS on for either spelling) and
/// the client token of `c`, a secure group.
fn client_env(c: &Cluster) -> [(&'static str, String); 2] {
    let secure = c.secure.as_ref().expect("a secure group");
    [("FENCELOCK_TLS_CA", secure.ca().display().to_string()), ("FENCELOCK_AUTH_TOKEN", secure.client_token.clone())]
}

/// The case: a follower, listed first, is down.
#[test]
fn every_command_with_the_first_listed_follower_down() {
    let mut c = Cluster::start(3);
    let leader = c.must_lead("at the start");
    let follower = (0..c.nodes.len()).find(|i| *i != leader).expect("a follower");
    c.nodes[follower].kill();
    let env = client_env(&c);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for (n, servers) in both_spellings(&listed_first(&c, follower)).iter().enumerate() {
        every_command(servers, &env, &[], &format!("follower-down-{n}"));
    }
}

/// The leader, listed first, is killed: the commands reach the new leader.
#[test]
fn every_command_with_the_first_listed_leader_killed() {
    let mut c = Cluster::start(3);
    let kill = c.kill_leader();
    let env = client_env(&c);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for (n, servers) in both_spellings(&listed_first(&c, kill.old)).iter().enumerate() {
        every_command(servers, &env, &[], &format!("leader-down-{n}"));
    }
}

/// A TLS group with an auth file, the first listed node down: every command
/// works with the CA and the token given by flags and environment
/// (`--tls-ca`, `FENCELOCK_AUTH_TOKEN`), and given in the URL
/// (`fencelock+tls://a,b,c?ca=…&token=…`).
#[test]
fn every_command_over_tls_with_a_token_and_the_first_listed_node_down() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let init = Command::new(bin()).args(["certs", "init", "--dir", &s(&certs), "--nodes", "3"]).output().unwrap();
    assert!(init.status.success(), "certs init: {}", stderr(&init));
    let auth = dir.path().join("auth.toml");
    let added = Command::new(bin())
        .args(["auth", "add-token", "ops", "--role", "admin", "--file", &s(&auth)])
        .output()
        .unwrap();
    assert!(added.status.success(), "add-token: {}", stderr(&added));
    let token = stdout(&added).trim().to_string();

    let mut nodes = TlsGroup::start(dir.path(), &certs, &auth);
    let hosts = nodes.addrs().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
    let ca = s(&certs.join("ca.pem"));
    let by_flags = format!("fencelock://{hosts}");
    let env = [("FENCELOCK_AUTH_TOKEN", token.as_str())];
    nodes.wait_serving(&by_flags, &env, &["--tls-ca", &ca]);
    nodes.kill_first();

    every_command(&by_flags, &env, &["--tls-ca", &ca], "tls-flags");
    let in_url = format!("fencelock+tls://{hosts}?ca={ca}&token={token}");
    every_command(&in_url, &[], &[], "tls-url");
    // The token did matter: without it the group refuses.
    let refused = fencelock(&by_flags, &[], &["locks", "--tls-ca", &ca]);
    assert_eq!(refused.status.code(), Some(77), "{}", stderr(&refused));
}

fn s(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Three TLS nodes with `--auth-file`, each killed on drop.
struct TlsGroup {
    nodes: Vec<(SocketAddr, Option<Child>)>,
    logs: Vec<PathBuf>,
}

impl TlsGroup {
    fn start(dir: &Path, certs: &Path, auth: &Path) -> TlsGroup {
        let addrs: Vec<SocketAddr> = (0..3).map(|_| SocketAddr::from(([127, 0, 0, 1], free_port()))).collect();
        let peers = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",");
        let (mut nodes, mut logs) = (Vec::new(), Vec::new());
        for (i, grpc) in addrs.iter().enumerate() {
            let id = i + 1;
            let log = dir.join(format!("node{id}.log"));
            let child = Command::new(bin())
                .args(["serve", "--node-id", &id.to_string(), "--data-dir", &s(&dir.join(format!("data{id}")))])
                .args(["--listen", &grpc.to_string(), "--http", &format!("127.0.0.1:{}", free_port())])
                .args(["--peers", &peers, "--auth-file", &s(auth)])
                .args(["--tls-cert", &s(&certs.join(format!("node{id}.pem")))])
                .args(["--tls-key", &s(&certs.join(format!("node{id}.key")))])
                .args(["--tls-ca", &s(&certs.join("ca.pem")), "--client-ca", &s(&certs.join("client-ca.pem"))])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("spawn fencelock serve");
            nodes.push((*grpc, Some(child)));
            logs.push(log);
        }
        TlsGroup { nodes, logs }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|(a, _)| *a).collect()
    }

    /// Until `locks` succeeds through the group (bounded: 30 s).
    fn wait_serving(&self, servers: &str, env: &[(&str, &str)], args: &[&str]) {
        let start = Instant::now();
        loop {
            let out = fencelock(servers, env, &[&["locks"], args].concat());
            if out.status.success() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the TLS group never served: {}\n{}",
                stderr(&out),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL the first node (listed first), leader or follower.
    fn kill_first(&mut self) {
        support::kill_child(&mut self.nodes[0].1);
    }

    fn logs(&self) -> String {
        self.logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n---\n")
    }
}

impl Drop for TlsGroup {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            support::kill_child(child);
        }
    }
}
