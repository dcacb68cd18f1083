//! `fencelock storage` with TLS (issue 15, "TLS on every port"), as a user
//! runs it: certificates from `fencelock certs init`, the storage server's
//! TLS flags (and their environment variables), a TLS lock service behind
//! `--lock-server https://…?ca=…`, the demo client writing through HTTPS,
//! the refusal of plaintext where other hosts can connect, and startup
//! errors that name the file.
#![allow(clippy::disallowed_methods)] // processes are waited for by the clock

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::secure::trusting;
use support::{bin, free_port, http_get, stderr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// `fencelock certs init --dir DIR --nodes 1`: ca.pem, node1.pem/.key for
/// localhost and 127.0.0.1, client-ca.pem, client.pem/.key.
fn make_certs(dir: &Path) -> PathBuf {
    support::secure::make_certs(dir, 1)
}

/// A child process killed on drop; its stderr in `log`.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
        let child =
            cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().expect("spawn fencelock");
        Proc { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTPS request with `Connection: close`: (status, body).
async fn https(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> std::io::Result<(u16, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut stream = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\nx");
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

async fn wait_https_healthy(addr: SocketAddr, tls: &Arc<rustls::ClientConfig>, p: &Proc) {
    let start = Instant::now();
    while !matches!(https(addr, tls, "GET", "/healthz", &[]).await, Ok((200, _))) {
        assert!(start.elapsed() < Duration::from_secs(30), "{addr} never served HTTPS:\n{}", p.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fencing(token: u64) -> Vec<(&'static str, String)> {
    vec![("Fencing-Lock", "demo-ledger".into()), ("Fencing-Token", token.to_string())]
}

/// `fencelock demo-client` (one acquire, fenced read, fenced write, release):
/// its JSON events.
fn demo_client(name: &str, server: &str, storage: &str, ca: &Path) -> Vec<serde_json::Value> {
    let out: Output = Command::new(bin())
        .args(["demo-client", "--name", name, "--server", server, "--storage", storage, "--storage-ca", &s(ca)])
        .args(["--ttl", "10s", "--wait", "10s"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "demo-client {name}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn event<'a>(events: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    events.iter().find(|e| e["event"] == kind).unwrap_or_else(|| panic!("no {kind:?} event: {events:?}"))
}

/// Rule: the storage server's TLS flags serve HTTPS; a client of this repo
/// (the demo client, `--storage https://… --storage-ca`) writes through it
/// with tokens of a TLS lock service, which the storage server itself asks
/// over TLS (`--lock-server https://…?ca=…`): a stale token is still refused
/// (409), a never-issued one too (400), and a plaintext client gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_over_tls_with_a_tls_lock_service_and_the_demo_client() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"));
    let ca = certs.join("ca.pem");
    let (grpc, admin, store) = (free_port(), free_port(), free_port());
    let (grpc, admin, store) = (
        SocketAddr::from(([127, 0, 0, 1], grpc)),
        SocketAddr::from(([127, 0, 0, 1], admin)),
        SocketAddr::from(([127, 0, 0, 1], store)),
    );
    let lock = Proc::spawn(
        Command::new(bin())
            .args([
                "serve",
                "--data-dir",
                &s(&dir.path().join("lock")),
                "--listen",
                &grpc.to_string(),
                "--http",
                &admin.to_string(),
            ])
            .args([
                "--tls-cert",
                &s(&certs.join("node1.pem")),
                "--tls-key",
                &s(&certs.join("node1.key")),
                "--tls-ca",
                &s(&ca),
            ]),
        dir.path().join("lock.log"),
    );
    let tls = trusting(&ca);
    let storage = Proc::spawn(
        Command::new(bin())
            .args([
                "storage",
                "--data-dir",
                &s(&dir.path().join("storage")),
                "--listen",
                &store.to_string(),
                "--token-margin",
                "0",
            ])
            .args(["--lock-server", &format!("https://{admin}?ca={}", s(&ca))])
            .env("FENCELOCK_STORAGE_TLS_CERT", certs.join("node1.pem"))
            .env("FENCELOCK_STORAGE_TLS_KEY", certs.join("node1.key")),
        dir.path().join("storage.log"),
    );
    wait_https_healthy(store, &tls, &storage).await;
    wait_https_healthy(admin, &tls, &lock).await;

    let server = format!("fencelock+tls://{grpc}?ca={}", s(&ca));
    let storage_url = format!("https://{store}");
    let a = demo_client("A", &server, &storage_url, &ca);
    assert_eq!(event(&a, "write")["status"], 201, "{a:?}");
    let b = demo_client("B", &server, &storage_url, &ca);
    assert_eq!(event(&b, "write")["status"], 200, "{b:?}");
    let (ta, tb) = (event(&a, "acquired")["token"].as_u64().unwrap(), event(&b, "acquired")["token"].as_u64().unwrap());
    assert!(tb > ta);

    let path = "/objects/ledger";
    let (status, body) = https(store, &tls, "PUT", path, &fencing(ta)).await.unwrap();
    assert_eq!(status, 409, "A's token is stale over TLS too: {body}");
    let (status, body) = https(store, &tls, "PUT", path, &fencing(tb + 1)).await.unwrap();
    assert_eq!(status, 400, "the count came from the TLS lock service: {body}\n{}", storage.log_text());
    assert!(body.contains("was never issued"), "{body}");
    let (status, body) = https(store, &tls, "GET", path, &[]).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "[\"A booked seat 7\",\"B booked seat 7\"]"));

    assert!(!matches!(http_get(store, "/healthz"), Ok((200, _))), "plaintext got an answer from the TLS port");
}

/// Rule: `fencelock storage` refuses plaintext on an address other hosts
/// can reach, in one line naming the way out, and writes nothing;
/// `--insecure` allows it, and so does TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_off_loopback_needs_tls_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let out = Command::new(bin()).args(["storage", "--data-dir", &s(&data), "--listen", &listen]).output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("--listen {listen} is reachable from other hosts and TLS is off")), "{err}");
    assert!(err.contains("--insecure") && err.contains("--tls-cert") && err.trim().lines().count() == 1, "{err}");
    assert!(!data.exists(), "nothing is written for a refused start");

    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let insecure = Proc::spawn(
        Command::new(bin()).args(["storage", "--data-dir", &s(&data), "--listen", &listen, "--insecure"]),
        dir.path().join("insecure.log"),
    );
    let start = Instant::now();
    while !matches!(http_get(local, "/healthz"), Ok((200, _))) {
        assert!(start.elapsed() < Duration::from_secs(20), "--insecure did not serve: {}", insecure.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(insecure);

    let certs = make_certs(&dir.path().join("certs"));
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let secure =
        Proc::spawn(
            Command::new(bin())
                .args(["storage", "--data-dir", &s(&dir.path().join("tls")), "--listen", &listen])
                .args(["--tls-cert", &s(&certs.join("node1.pem")), "--tls-key", &s(&certs.join("node1.key"))]),
            dir.path().join("secure.log"),
        );
    wait_https_healthy(SocketAddr::from(([127, 0, 0, 1], port)), &trusting(&certs.join("ca.pem")), &secure).await;
}

/// Rule: a TLS file that does not load stops `fencelock storage` at once
/// (exit 70) with an error naming the file and what is wrong.
#[test]
fn storage_tls_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(&dir.path().join("certs"));
    let run = |cert: &Path, key: &Path| {
        let listen = format!("127.0.0.1:{}", free_port());
        Command::new(bin())
            .args(["storage", "--data-dir", &s(&dir.path().join("d")), "--listen", &listen])
            .args(["--tls-cert", &s(cert), "--tls-key", &s(key)])
            .output()
            .unwrap()
    };
    let out = run(&certs.join("node1.pem"), &certs.join("client.key"));
    assert_eq!(out.status.code(), Some(70));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the private key {} does not match the certificate {}",
            s(&certs.join("client.key")),
            s(&certs.join("node1.pem"))
        )),
        "{err}"
    );
    let missing = dir.path().join("nope.pem");
    let out = run(&missing, &certs.join("node1.key"));
    assert_eq!(out.status.code(), Some(70));
    assert!(stderr(&out).contains(&format!("cannot read the certificate {}", s(&missing))), "{}", stderr(&out));
    let out = run(&certs.join("node1.key"), &certs.join("node1.key"));
    assert_eq!(out.status.code(), Some(70));
    assert!(
        stderr(&out).contains(&format!("the certificate {} holds no PEM certificate", s(&certs.join("node1.key")))),
        "{}",
        stderr(&out)
    );
    let out = Command::new(bin())
        .args(["storage", "--require-client-cert", "--tls-cert", "c", "--tls-key", "k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--require-client-cert needs --client-ca: {}", stderr(&out));
}
