//! TLS on a real `fencelock serve` (issue 15): certificates from
//! `fencelock certs init`, clients over TLS, plaintext and strangers refused,
//! Raft only from members, certificates rotated under a held lock, a 3-node
//! group whose members talk TLS to each other, the refusal to serve
//! plaintext (or without authentication) where others can connect, and the
//! README's secure setup with tokens and permissions from `fencelock auth`.
//!
//! Invariant: INV-2's precondition, "only members move the state": a
//! process without a node certificate of the cluster CA cannot make a node
//! install a snapshot (the forged-snapshot finding sent tokens back to 1).
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock::{Client, ClientTls, LockOptions, Outcome};
use fencelock_proto::raft::{raft_client::RaftClient, RaftFrame, RaftPayload};
use support::secure::{add_token, certs_init, fencelock_as, make_certs};
use support::{bin, free_port, stderr, stdout};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// A TLS node: `serve` with node `id`'s certificate of `certs`.
struct Node {
    grpc: SocketAddr,
    http: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Node {
    fn start(dir: &Path, certs: &Path, id: u64, extra: &[String]) -> Node {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        Node::start_at(dir, certs, id, grpc, http, extra)
    }

    fn start_at(dir: &Path, certs: &Path, id: u64, grpc: SocketAddr, http: SocketAddr, extra: &[String]) -> Node {
        let log = dir.join(format!("node{id}.log"));
        let child = Command::new(bin())
            .args(["serve", "--node-id", &id.to_string(), "--data-dir", &s(&dir.join(format!("data{id}")))])
            .args(["--listen", &grpc.to_string(), "--http", &http.to_string()])
            .args(["--tls-cert", &s(&certs.join(format!("node{id}.pem")))])
            .args(["--tls-key", &s(&certs.join(format!("node{id}.key")))])
            .args(["--tls-ca", &s(&certs.join("ca.pem")), "--client-ca", &s(&certs.join("client-ca.pem"))])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn fencelock serve");
        Node { grpc, http, child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_of(certs: &Path, client_cert: bool) -> ClientTls {
    let (cert, key) = (certs.join("client.pem"), certs.join("client.key"));
    let (cert, key) = if client_cert { (Some(cert.as_path()), Some(key.as_path())) } else { (None, None) };
    ClientTls::from_files(&certs.join("ca.pem"), cert, key).expect("read client TLS files")
}

/// A TLS client of `url`, retried while the node starts (bounded).
async fn tls_client(url: &str, tls: ClientTls) -> Client {
    let start = Instant::now();
    loop {
        match Client::builder(url).tls(tls.clone()).connect_timeout(Duration::from_secs(1)).connect().await {
            Ok(c) => {
                if c.list("", 1).await.is_ok() {
                    return c;
                }
            }
            Err(e) if start.elapsed() > Duration::from_secs(30) => panic!("no TLS connection to {url}: {e}"),
            Err(_) => {}
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the node at {url} never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn acquire_token(c: &Client, name: &str) -> u64 {
    match c.acquire_detached(name, LockOptions::default()).await.expect("acquire") {
        Outcome::Acquired(g) => g.token,
        other => panic!("{name} not acquired: {other:?}"),
    }
}

/// `certs init` writes the CA, node, client-CA and client files, keys
/// readable by their owner only, and never overwrites a file.
#[test]
fn certs_init_writes_a_group_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = certs_init(dir.path(), 3);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(listed.len(), 2 + 6 + 4, "CA, 3 nodes, client CA, client: {listed:?}");
    for f in ["ca.pem", "node1.pem", "node3.key", "client-ca.pem", "client.pem"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    for key in ["ca.key", "node2.key", "client.key", "client-ca.key"] {
        let mode = std::fs::metadata(dir.path().join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key} must be readable by its owner only");
    }
    let before = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let again = certs_init(dir.path(), 3);
    assert_eq!(again.status.code(), Some(70));
    assert!(stderr(&again).contains("exists already"), "{}", stderr(&again));
    assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), before, "the CA was not overwritten");
}

/// A TLS node serves TLS clients (with or without a client certificate),
/// and refuses a plaintext client and a client that trusts another CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_served_plaintext_and_strangers_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 1);
    let other = make_certs(&dir.path().join("other"), 1);
    let node = Node::start(dir.path(), &certs, 1, &[]);
    let url = format!("https://{}", node.grpc);
    let c = tls_client(&url, tls_of(&certs, false)).await;
    let t1 = acquire_token(&c, "a").await;
    let mtls = tls_client(&url, tls_of(&certs, true)).await;
    let t2 = acquire_token(&mtls, "b").await;
    assert!(t2 > t1, "tokens increase: {t1} then {t2}");

    let plain = Client::builder(format!("http://{}", node.grpc))
        .connect_timeout(Duration::from_secs(2))
        .rpc_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let plain_failed = match plain {
        Err(_) => true,
        Ok(p) => p.list("", 1).await.is_err(),
    };
    assert!(plain_failed, "a plaintext client must not be served by a TLS node");
    let stranger = Client::builder(&url)
        .tls(tls_of(&other, false))
        .connect_timeout(Duration::from_secs(2))
        .rpc_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let Err(err) = stranger else { panic!("a client trusting another CA must not connect") };
    assert!(format!("{err}").to_lowercase().contains("certificate"), "the error names the certificate: {err}");

    // The CLI: the same through --tls-ca, and a clear error without it.
    let ok = Command::new(bin())
        .args([
            "acquire",
            "cli-lock",
            "--server",
            &format!("fencelock://{}", node.grpc),
            "--tls-ca",
            &s(&certs.join("ca.pem")),
        ])
        .output()
        .unwrap();
    assert!(ok.status.success(), "CLI over TLS: {}", stderr(&ok));
    assert!(stdout(&ok).contains("token"), "{}", stdout(&ok));
    let https_without_ca =
        Command::new(bin()).args(["locks", "--server", &format!("fencelock+tls://{}", node.grpc)]).output().unwrap();
    assert_eq!(https_without_ca.status.code(), Some(70));
    assert!(stderr(&https_without_ca).contains("ca="), "{}", stderr(&https_without_ca));
}

/// `--require-client-cert`: a client without a certificate of the client
/// CA is refused; one with it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 1);
    let node = Node::start(dir.path(), &certs, 1, &["--require-client-cert".into()]);
    let url = format!("https://{}", node.grpc);
    let with = tls_client(&url, tls_of(&certs, true)).await;
    acquire_token(&with, "x").await;
    let without = Client::builder(&url)
        .tls(tls_of(&certs, false))
        .connect_timeout(Duration::from_secs(2))
        .rpc_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let refused = match without {
        Err(_) => true,
        Ok(c) => c.list("", 1).await.is_err(),
    };
    assert!(refused, "a client without a certificate must be refused");
}

/// A Raft client for `addr` presenting `identity` (cert, key), trusting `ca`.
async fn raft_client(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> RaftClient<tonic::transport::Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some((c, k)) = identity {
        tls = tls.identity(Identity::from_pem(std::fs::read(c).unwrap(), std::fs::read(k).unwrap()));
    }
    let ch =
        Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
    RaftClient::new(ch)
}

/// A forged snapshot that would reset the token counter, sent by a process
/// that is not a member (no certificate, or a client certificate), is
/// refused with UNAUTHENTICATED before it is even decoded, and so are its
/// entries (a call, or a stream refused as it opens) and a
/// membership change handed over the peer service (`ChangeMembers`); the node's
/// tokens go on from where they were. A member's certificate gets past the
/// check (the garbage payload is then refused as malformed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_messages_only_from_members() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 2);
    let node = Node::start(dir.path(), &certs, 1, &[]);
    let c = tls_client(&format!("https://{}", node.grpc), tls_of(&certs, false)).await;
    let before = acquire_token(&c, "t").await;

    let ca = certs.join("ca.pem");
    let forged =
        RaftPayload { json: br#"{"vote":{"leader_id":{"term":99,"node_id":2},"committed":true},"meta":{}}"#.to_vec() };
    let client_cert = (certs.join("client.pem"), certs.join("client.key"));
    for identity in [None, Some((client_cert.0.as_path(), client_cert.1.as_path()))] {
        let mut raft = raft_client(node.grpc, &ca, identity).await;
        let status = raft.install_snapshot(forged.clone()).await.expect_err("a non-member's snapshot is refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        let status = raft.append_entries(forged.clone()).await.expect_err("a non-member's entries are refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        let frames =
            tonic::codegen::tokio_stream::iter([RaftFrame { head: forged.json.clone(), ..Default::default() }]);
        let status = raft.append_entries_stream(frames).await.expect_err("a non-member's append stream is refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        let remove = RaftPayload { json: br#"{"op":"remove","id":1}"#.to_vec() };
        let status = raft.change_members(remove).await.expect_err("a non-member's membership change is refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }
    let member = (certs.join("node2.pem"), certs.join("node2.key"));
    let mut raft = raft_client(node.grpc, &ca, Some((&member.0, &member.1))).await;
    let status = raft.vote(RaftPayload { json: b"not json".to_vec() }).await.expect_err("garbage is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "a member passes the check: {status:?}");

    let after = acquire_token(&c, "t2").await;
    assert!(after > before, "tokens go on from {before}: got {after}");
    assert!(node.log_text().contains("refused a Raft message"), "the refusals are logged");
}

/// Certificates rotated to a new CA while a lock is held by a client that
/// trusts both, and three others acquire and release in a loop: every call
/// succeeds, the holder keeps its lease, new handshakes use the new
/// certificate (a client trusting only the old CA is refused, one trusting
/// only the new CA is served), and the node never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_a_restart_or_a_lost_lease() {
    let dir = tempfile::tempdir().unwrap();
    let old = make_certs(&dir.path().join("old"), 1);
    let new = make_certs(&dir.path().join("new"), 1);
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let copy = |from: &Path| {
        for f in ["node1.pem", "node1.key", "ca.pem", "client-ca.pem"] {
            // Write-then-rename: the node never reads half a file.
            let tmp = live.join(format!(".{f}.tmp"));
            std::fs::copy(from.join(f), &tmp).unwrap();
            std::fs::rename(&tmp, live.join(f)).unwrap();
        }
    };
    copy(&old);
    let node = Node::start(dir.path(), &live, 1, &[]);
    let url = format!("https://{}", node.grpc);
    let both = dir.path().join("both.pem");
    let bundle = [std::fs::read(old.join("ca.pem")).unwrap(), std::fs::read(new.join("ca.pem")).unwrap()].concat();
    std::fs::write(&both, bundle).unwrap();
    let holder = tls_client(&url, ClientTls::from_files(&both, None, None).unwrap()).await;
    let opts = LockOptions::default().ttl(Duration::from_secs(2));
    let guard = match holder.lock("rotating").options(opts).acquire().await.expect("acquire") {
        Outcome::Acquired(g) => g,
        other => panic!("not acquired: {other:?}"),
    };
    // Load through the rotation: three clients acquire and release locks of
    // their own in a loop; every call must succeed (with the client's own
    // retries), before and after the new certificates are in.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rotated = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..3 {
        let c = tls_client(&url, ClientTls::from_files(&both, None, None).unwrap()).await;
        let (stop, rotated) = (stop.clone(), rotated.clone());
        load.push(tokio::spawn(async move {
            let (mut before, mut after) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let was_rotated = rotated.load(std::sync::atomic::Ordering::Relaxed);
                match c.lock(format!("load-{w}")).acquire().await {
                    Ok(Outcome::Acquired(g)) => assert!(g.release().await.expect("release under rotation"), "released"),
                    other => panic!("acquire under rotation: {other:?}"),
                }
                *(if was_rotated { &mut after } else { &mut before }) += 1;
            }
            (before, after)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    copy(&new);
    rotated.store(true, std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    loop {
        let fresh =
            Client::builder(&url).tls(tls_of(&new, false)).connect_timeout(Duration::from_secs(1)).connect().await;
        if let Ok(c) = fresh {
            if c.list("", 1).await.is_ok() {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the new certificate was not picked up:\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stale = Client::builder(&url)
        .tls(tls_of(&old, false))
        .connect_timeout(Duration::from_secs(2))
        .rpc_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(stale.is_err(), "a client trusting only the old CA must be refused after the rotation");
    // Three TTLs on: the lease was kept alive through the rotation.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!guard.is_lost(), "the holder lost its lease in the rotation");
    let held = holder.list("", 100).await.expect("list");
    assert!(held.iter().any(|l| l.name == "rotating" && l.holder.is_some()), "still held: {held:?}");
    assert!(node.log_text().contains("TLS certificates reloaded"), "{}", node.log_text());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in load {
        let (before, after) = w.await.expect("a load client failed");
        assert!(before > 0 && after > 0, "cycles before and after the rotation: {before}, {after}");
    }
}

/// Three TLS nodes: they elect a leader over TLS (each presents its node
/// certificate to the others) and serve a client given all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_talks_tls_between_members() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 3);
    let addrs: Vec<(SocketAddr, SocketAddr)> = (0..3)
        .map(|_| (SocketAddr::from(([127, 0, 0, 1], free_port())), SocketAddr::from(([127, 0, 0, 1], free_port()))))
        .collect();
    let peers = addrs.iter().enumerate().map(|(i, (g, _))| format!("{}={g}", i + 1)).collect::<Vec<_>>().join(",");
    let nodes: Vec<Node> = addrs
        .iter()
        .enumerate()
        .map(|(i, (g, h))| Node::start_at(dir.path(), &certs, i as u64 + 1, *g, *h, &["--peers".into(), peers.clone()]))
        .collect();
    let url = addrs.iter().map(|(g, _)| format!("https://{g}")).collect::<Vec<_>>().join(",");
    let c = tls_client(&url, tls_of(&certs, true)).await;
    let t1 = acquire_token(&c, "g1").await;
    let t2 = acquire_token(&c, "g2").await;
    assert!(t2 > t1);
    let logs: String = nodes.iter().map(Node::log_text).collect();
    assert!(!logs.contains("refused a Raft message"), "members refused each other:\n{logs}");
}

/// Plaintext on an address other hosts can reach is refused, with the way
/// out named; `--insecure` allows it.
#[test]
fn plaintext_on_a_shared_network_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = Command::new(bin())
        .args(["serve", "--data-dir", &s(&dir.path().join("d")), "--listen", &format!("0.0.0.0:{port}")])
        .args(["--advertise", &format!("127.0.0.1:{port}"), "--http", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70));
    let err = stderr(&out);
    assert!(err.contains("TLS is off") && err.contains("--insecure"), "{err}");
    assert!(!dir.path().join("d").exists(), "nothing was written for a refused start");

    let mut ok = Command::new(bin())
        .args(["serve", "--data-dir", &s(&dir.path().join("d")), "--listen", &format!("0.0.0.0:{port}")])
        .args([
            "--advertise",
            &format!("127.0.0.1:{port}"),
            "--http",
            &format!("127.0.0.1:{}", free_port()),
            "--insecure",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !dir.path().join("d").join("fencelock.redb").exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "--insecure did not start");
        assert!(ok.try_wait().unwrap().is_none(), "--insecure exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = ok.kill();
    let _ = ok.wait();
}

/// The admin commands speak TLS to a TLS node's admin port: `cluster status`
/// and `snapshot save` with `--tls-ca` (and the client certificate); without
/// it they fail with an error instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 1);
    let node = Node::start(dir.path(), &certs, 1, &[]);
    let c = tls_client(&format!("https://{}", node.grpc), tls_of(&certs, false)).await;
    acquire_token(&c, "backed-up").await;
    let admin = node.http.to_string();
    let tls_args = ["--tls-ca", &s(&certs.join("ca.pem")), "--tls-cert", &s(&certs.join("client.pem"))];
    let key = ["--tls-key".to_string(), s(&certs.join("client.key"))];
    let status = Command::new(bin())
        .args(["cluster", "status", "--json", "--admin", &admin])
        .args(tls_args)
        .args(&key)
        .output()
        .unwrap();
    assert!(status.status.success(), "cluster status over TLS: {}", stderr(&status));
    assert!(stdout(&status).contains("\"leader\":1"), "{}", stdout(&status));
    let plain = Command::new(bin()).args(["cluster", "status", "--admin", &admin]).output().unwrap();
    assert_eq!(plain.status.code(), Some(70), "plaintext to a TLS admin port must fail: {}", stdout(&plain));
    let file = dir.path().join("backup.json");
    let save = Command::new(bin())
        .args(["snapshot", "save", &s(&file), "--admin", &admin, "--tls-ca", &s(&certs.join("ca.pem"))])
        .output()
        .unwrap();
    assert!(save.status.success(), "snapshot save over TLS: {}", stderr(&save));
    assert!(std::fs::read_to_string(&file).unwrap().contains("backed-up"), "the backup holds the lock");
}

/// The README's secure setup, as a user runs it: `certs init`, `auth
/// add-token`, a TLS node with `--auth-file`, then `run`, `acquire`, `locks`
/// and `cluster status` with and without tokens and permissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_permissions_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 1);
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, "[roles.batch]\nrules = [{ prefix = \"jobs/\", verbs = [\"acquire\", \"read\"] }]\n")
        .unwrap();
    let ops = add_token(&file, "ops", "admin");
    let batch = add_token(&file, "batch-runner", "batch");
    let refused = fencelock_as(None, &["auth", "add-token", "x", "--role", "nope", "--file", &s(&file)]);
    assert_eq!(refused.status.code(), Some(70), "an unknown role is refused: {}", stderr(&refused));
    assert!(stderr(&refused).contains("no role \"nope\""), "{}", stderr(&refused));
    let listed = fencelock_as(None, &["auth", "check", "--file", &s(&file)]);
    assert!(
        stdout(&listed).contains("batch-runner\ttoken") && stdout(&listed).contains("acquire,read on \"jobs/\""),
        "{}",
        stdout(&listed)
    );

    let node = Node::start(dir.path(), &certs, 1, &["--auth-file".into(), s(&file)]);
    let server = format!("fencelock+tls://{}", node.grpc);
    let ca = s(&certs.join("ca.pem"));
    let (server, ca) = (server.as_str(), ca.as_str());
    let run = |token, lock| {
        fencelock_as(
            token,
            &["run", lock, "--server", server, "--tls-ca", ca, "--", "sh", "-c", "test -n \"$FENCELOCK_TOKEN\""],
        )
    };
    let start = Instant::now();
    while !run(Some(&batch), "jobs/nightly").status.success() {
        assert!(start.elapsed() < Duration::from_secs(30), "run with a token never succeeded: {}", node.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run(None, "jobs/nightly");
    assert_eq!(out.status.code(), Some(77), "no token: {}", stderr(&out));
    assert!(stderr(&out).contains("not authenticated"), "{}", stderr(&out));
    let out = run(Some("flt_00000000_00"), "jobs/nightly");
    assert_eq!(out.status.code(), Some(77), "a wrong token: {}", stderr(&out));
    let out = run(Some(&batch), "billing/x");
    assert_eq!(out.status.code(), Some(77), "outside its prefix: {}", stderr(&out));
    assert!(
        stderr(&out).contains("permission denied: batch-runner may not acquire lock \"billing/x\""),
        "{}",
        stderr(&out)
    );

    // Who holds it: the owner is shown to anyone who may read the lock.
    let held =
        fencelock_as(Some(&batch), &["acquire", "jobs/held", "--ttl", "60s", "--server", server, "--tls-ca", ca]);
    assert!(held.status.success(), "{}", stderr(&held));
    let locks =
        fencelock_as(Some(&batch), &["locks", "--prefix", "jobs/", "--json", "--server", server, "--tls-ca", ca]);
    assert!(locks.status.success(), "{}", stderr(&locks));
    assert!(stdout(&locks).contains("\"owner\":\"batch-runner\""), "{}", stdout(&locks));
    let all = fencelock_as(Some(&batch), &["locks", "--server", server, "--tls-ca", ca]);
    assert_eq!(all.status.code(), Some(77), "listing every lock needs read on \"\": {}", stderr(&all));

    // The admin port: membership is for admins.
    let admin = node.http.to_string();
    let status = |token| fencelock_as(token, &["cluster", "status", "--admin", &admin, "--tls-ca", ca]);
    assert_eq!(status(Some(&batch)).status.code(), Some(77));
    let ok = status(Some(&ops));
    assert!(ok.status.success(), "{}", stderr(&ok));
}

/// TLS without authentication on an address other hosts can reach is
/// refused as well, naming --auth-file.
#[test]
fn tls_without_authentication_on_a_shared_network_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 1);
    let port = free_port();
    let out = Command::new(bin())
        .args(["serve", "--data-dir", &s(&dir.path().join("d")), "--listen", &format!("0.0.0.0:{port}")])
        .args(["--advertise", &format!("127.0.0.1:{port}"), "--http", &format!("127.0.0.1:{}", free_port())])
        .args(["--tls-cert", &s(&certs.join("node1.pem")), "--tls-key", &s(&certs.join("node1.key"))])
        .args(["--tls-ca", &s(&certs.join("ca.pem"))])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70));
    let err = stderr(&out);
    assert!(err.contains("authentication is off") && err.contains("--auth-file"), "{err}");
    assert!(!dir.path().join("d").exists(), "nothing was written for a refused start");
}

/// A group whose members serve Raft on a port of their own (`--peer-listen`,
/// listed in `--peers` as CLIENT/PEER): it forms over TLS and serves clients;
/// the client port no longer speaks Raft at all, the peer port completes a
/// handshake only with a node certificate, `cluster status` shows both
/// addresses, and a follower hands a membership change to the leader's peer
/// port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_a_peer_port_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 3);
    let port = || SocketAddr::from(([127, 0, 0, 1], free_port()));
    let addrs: Vec<(SocketAddr, SocketAddr, SocketAddr)> = (0..3).map(|_| (port(), port(), port())).collect();
    let peers =
        addrs.iter().enumerate().map(|(i, (g, _, p))| format!("{}={g}/{p}", i + 1)).collect::<Vec<_>>().join(",");
    let nodes: Vec<Node> = addrs
        .iter()
        .enumerate()
        .map(|(i, (g, h, p))| {
            let extra = ["--peers".into(), peers.clone(), "--peer-listen".into(), p.to_string()];
            Node::start_at(dir.path(), &certs, i as u64 + 1, *g, *h, &extra)
        })
        .collect();
    let url = addrs.iter().map(|(g, _, _)| format!("https://{g}")).collect::<Vec<_>>().join(",");
    let c = tls_client(&url, tls_of(&certs, true)).await;
    let t1 = acquire_token(&c, "p1").await;

    let ca = certs.join("ca.pem");
    let member = (certs.join("node2.pem"), certs.join("node2.key"));
    let garbage = RaftPayload { json: b"not json".to_vec() };
    let mut on_client_port = raft_client(addrs[0].0, &ca, Some((&member.0, &member.1))).await;
    let status = on_client_port.vote(garbage.clone()).await.expect_err("no Raft on the client port");
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    let mut on_peer_port = raft_client(addrs[0].2, &ca, Some((&member.0, &member.1))).await;
    let status = on_peer_port.vote(garbage.clone()).await.expect_err("garbage is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "a member reaches Raft on the peer port: {status:?}");
    let client_cert = Identity::from_pem(
        std::fs::read(certs.join("client.pem")).unwrap(),
        std::fs::read(certs.join("client.key")).unwrap(),
    );
    let tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap())).identity(client_cert);
    let stranger = async {
        let ch = Endpoint::from_shared(format!("https://{}", addrs[0].2))?.tls_config(tls)?.connect().await?;
        Ok::<_, Box<dyn std::error::Error>>(RaftClient::new(ch).vote(garbage).await?)
    };
    assert!(stranger.await.is_err(), "a client certificate must not reach the peer port");

    let admin: Vec<String> = addrs.iter().map(|(_, h, _)| h.to_string()).collect();
    let tls_args = ["--tls-ca".to_string(), s(&ca)];
    let status = Command::new(bin())
        .args(["cluster", "status", "--json", "--admin", &admin.join(",")])
        .args(&tls_args)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", stderr(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let shown: Vec<&str> =
        json["members"].as_array().unwrap().iter().map(|m| m["peer_addr"].as_str().unwrap_or("")).collect();
    assert_eq!(shown, addrs.iter().map(|(_, _, p)| p.to_string()).collect::<Vec<_>>());

    // Remove node 3 through a follower: it hands the change to the leader's peer port.
    let leader = json["leader"].as_u64().unwrap();
    let follower = (1..=2u64).find(|id| *id != leader).unwrap();
    let via = admin[follower as usize - 1].clone();
    let third = if leader == 3 { 2 } else { 3 };
    let removed = Command::new(bin())
        .args(["cluster", "remove", &third.to_string(), "--admin", &via])
        .args(&tls_args)
        .output()
        .unwrap();
    assert!(removed.status.success(), "remove via follower {follower}: {}", stderr(&removed));
    let t2 = acquire_token(&c, "p2").await;
    assert!(t2 > t1);
    drop(nodes);
}

/// `fencelock auth` against a running group (INV-14): an admin from the
/// auth file defines a role and a token through a follower (which hands the
/// change to the leader), the token works at once through any member, is
/// limited to its role's prefix, cannot change the policy, and stops working
/// on every member once removed; the policy outlives a restart of the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_policy_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"), 3);
    let file = dir.path().join("auth.toml");
    let ops = add_token(&file, "ops", "admin");
    let port = || SocketAddr::from(([127, 0, 0, 1], free_port()));
    let addrs: Vec<(SocketAddr, SocketAddr, SocketAddr)> = (0..3).map(|_| (port(), port(), port())).collect();
    let peers =
        addrs.iter().enumerate().map(|(i, (g, _, p))| format!("{}={g}/{p}", i + 1)).collect::<Vec<_>>().join(",");
    let start = |i: usize| {
        let (g, h, p) = addrs[i];
        let extra =
            ["--peers".into(), peers.clone(), "--peer-listen".into(), p.to_string(), "--auth-file".into(), s(&file)];
        Node::start_at(dir.path(), &certs, i as u64 + 1, g, h, &extra)
    };
    let mut nodes: Vec<Node> = (0..3).map(start).collect();
    let ca = s(&certs.join("ca.pem"));
    let admins: Vec<String> = addrs.iter().map(|(_, h, _)| h.to_string()).collect();
    let servers =
        format!("fencelock+tls://{}", addrs.iter().map(|(g, _, _)| g.to_string()).collect::<Vec<_>>().join(","));
    let auth = |token: &str, admin: &str, args: &[&str]| {
        let mut all = vec!["auth"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--admin", admin, "--tls-ca", &ca]);
        fencelock_as(Some(token), &all)
    };
    let leader = || {
        let out =
            fencelock_as(Some(&ops), &["cluster", "status", "--json", "--admin", &admins.join(","), "--tls-ca", &ca]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        json["leader"].as_u64()
    };
    let started = Instant::now();
    let leader_id = loop {
        if let Some(l) = leader() {
            break l;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no leader: {}", nodes[0].log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    let follower = admins[(leader_id as usize) % 3].clone(); // the node after the leader

    let out = auth(&ops, &follower, &["role", "worker", "--rule", "jobs/=acquire,read"]);
    assert!(out.status.success(), "role via a follower: {}", stderr(&out));
    let out = auth(&ops, &follower, &["add-token", "runner", "--role", "worker", "--max-leases", "5"]);
    assert!(out.status.success(), "add-token via a follower: {}", stderr(&out));
    let runner = stdout(&out).trim().to_string();
    assert!(runner.starts_with("flt_"), "{runner:?}");

    let acquire = |token: &str, lock: &str| {
        fencelock_as(Some(token), &["acquire", lock, "--ttl", "30s", "--server", &servers, "--tls-ca", &ca])
    };
    let out = acquire(&runner, "jobs/a");
    assert!(out.status.success(), "the new token works at once: {}", stderr(&out));
    let out = acquire(&runner, "billing/a");
    assert_eq!(out.status.code(), Some(77), "outside its role: {}", stderr(&out));
    let out = auth(&runner, &follower, &["role", "worker", "--rule", "=acquire"]);
    assert_eq!(out.status.code(), Some(77), "a worker cannot change the policy: {}", stderr(&out));

    let out = auth(&ops, &admins[0], &["remove-role", "worker"]);
    assert!(!out.status.success() && stderr(&out).contains("in use"), "a role in use stays: {}", stderr(&out));
    let out = auth(&ops, &admins[0], &["add-token", "ops", "--role", "worker"]);
    assert!(
        !out.status.success() && stderr(&out).contains("auth file"),
        "the file's admin cannot be shadowed: {}",
        stderr(&out)
    );
    let listed = auth(&ops, &admins[2], &["list"]);
    assert!(
        stdout(&listed).contains("runner") && stdout(&listed).contains("acquire,read on \"jobs/\""),
        "{}",
        stdout(&listed)
    );
    assert!(!stdout(&listed).contains("sha256"), "no hash is shown");

    // Restart every node: the policy is in the log, the token still works.
    for n in nodes.drain(..) {
        drop(n);
    }
    nodes = (0..3).map(start).collect();
    let started = Instant::now();
    while !acquire(&runner, "jobs/b").status.success() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the token is gone after a restart: {}",
            nodes[0].log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let out = auth(&ops, &admins.join(","), &["remove", "runner"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = acquire(&runner, "jobs/c");
    assert_eq!(out.status.code(), Some(77), "a removed token is refused at once: {}", stderr(&out));
    assert!(stderr(&out).contains("not authenticated"), "{}", stderr(&out));
}
