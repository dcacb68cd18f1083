//! The fenced storage server over TLS (issue 15, "TLS on every port"), with
//! real certificates from `fencelock_server::certs`, real rustls clients and
//! a real lock service: fenced writes and stale tokens over HTTPS, plaintext
//! and certificate-less clients refused, silent connections closed by the
//! timeouts, plaintext refused off loopback, certificates rotated by rename
//! without a restart, and an `https://` lock service asked with its CA and a
//! bearer token.

#![allow(clippy::disallowed_methods)] // the test times how long the server keeps a connection open

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fencelock_fence::storage::{
    self,
    rustls::{
        self,
        pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    },
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::storage_server::{fenced, parse_response, stale_body, try_request, Resp};

// ------------------------------------------------------------- fixtures ---

/// `certs::init` into `dir`: ca.pem, node1.pem/.key (for localhost and
/// 127.0.0.1), client-ca.pem, client.pem/.key.
fn certs(dir: &Path) -> PathBuf {
    fencelock_server::certs::init(dir, 1, &["localhost".into(), "127.0.0.1".into()]).expect("make certificates");
    dir.to_path_buf()
}

fn server_files(certs: &Path) -> storage::TlsFiles {
    storage::TlsFiles::new(certs.join("node1.pem"), certs.join("node1.key"))
}

/// A rustls client trusting `ca`, presenting `identity` if given, ALPN
/// http/1.1.
fn client_tls(ca: &Path, identity: Option<&Path>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(certs) => {
            let chain = CertificateDer::pem_file_iter(certs.join("client.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(certs.join("client.key")).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One HTTPS request (`Connection: close`): the response and the protocol
/// the server chose (ALPN).
async fn tls_request(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(Resp, Option<Vec<u8>>)> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut stream = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await?;
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let resp = parse_response(&raw)
        .ok_or_else(|| std::io::Error::other(format!("bad response {:?}", String::from_utf8_lossy(&raw))))?;
    Ok((resp, alpn))
}

async fn tls_put(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    key: &str,
    token: u64,
    body: &str,
) -> std::io::Result<Resp> {
    let token = token.to_string();
    let path = format!("/objects/{key}");
    Ok(tls_request(addr, tls, "PUT", &path, &fenced(&token), body.as_bytes()).await?.0)
}

async fn tls_mark(addr: SocketAddr, tls: &Arc<rustls::ClientConfig>, key: &str) -> Value {
    let (resp, _) = tls_request(addr, tls, "GET", &format!("/fence/{key}"), &[], b"").await.unwrap();
    resp.json()["highest"].clone()
}

/// A storage server in this process, stopped by [`TlsServer::shutdown`].
struct TlsServer {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TlsServer {
    async fn start(config: storage::Config) -> Self {
        Self::start_on("127.0.0.1:0", config).await
    }

    async fn start_on(listen: &str, config: storage::Config) -> Self {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(storage::serve_with(listener, config, async move {
            let _ = stopped.await;
        }));
        Self { addr, stop, task }
    }

    async fn shutdown(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// Reads `stream` until the server closes it (EOF or an error) and returns
/// how long that took; panics if it is still open after `limit`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(start + limit, stream.read(&mut buf)).await {
            Err(_) => panic!("the connection is still open after {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

// ---------------------------------------------------------------- tests ---

/// Rule: over TLS the storage server is the same fenced store: a fenced
/// write from a TLS client is admitted, a stale token is still refused
/// (409, nothing changed), and the protocol is HTTP/1.1 by ALPN.
#[tokio::test]
async fn over_tls_a_fenced_write_is_admitted_and_a_stale_token_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let mut config = storage::Config::new(dir.path().join("data"));
    config.tls = Some(server_files(&certs));
    let s = TlsServer::start(config).await;
    let tls = client_tls(&certs.join("ca.pem"), None);

    let (resp, alpn) = tls_request(s.addr, &tls, "PUT", "/objects/doc", &fenced("5"), b"v5")
        .await
        .expect("a TLS client reaches the TLS storage server");
    assert_eq!(resp.status, 201, "{:?}", resp.json());
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    let stale = tls_put(s.addr, &tls, "doc", 4, "stale").await.unwrap();
    assert_eq!(stale.status, 409, "a stale token over TLS is still refused");
    assert_eq!(stale.json(), stale_body(fencelock_fence::Access::Write, 5, 4));
    let (got, _) = tls_request(s.addr, &tls, "GET", "/objects/doc", &[], b"").await.unwrap();
    assert_eq!(got.text(), "v5", "the stale write changed nothing");
    s.shutdown().await;
}

/// Rule: a plaintext client of the TLS port fails cleanly: no HTTP answer,
/// the connection closed promptly (not left hanging), and the port keeps
/// serving TLS clients.
#[tokio::test]
async fn a_plaintext_client_of_the_tls_port_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let mut config = storage::Config::new(dir.path().join("data"));
    config.tls = Some(server_files(&certs));
    let s = TlsServer::start(config).await;

    let start = Instant::now();
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        try_request(s.addr, "PUT", "/objects/doc", &fenced("5"), b"plain"),
    )
    .await
    .expect("a plaintext client is answered or closed at once, not left hanging");
    assert!(plain.is_err(), "a plaintext request got an HTTP answer: {plain:?}");
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());

    let tls = client_tls(&certs.join("ca.pem"), None);
    assert_eq!(tls_mark(s.addr, &tls, "doc").await, Value::Null, "the plaintext PUT did nothing");
    assert_eq!(tls_put(s.addr, &tls, "doc", 5, "v").await.unwrap().status, 201);
    s.shutdown().await;
}

/// Rule: with `require_client_cert` (`--require-client-cert`) a client
/// without a certificate of the client CA is refused and changes nothing;
/// one with it is served. Without the requirement a certificate is optional.
#[tokio::test]
async fn with_required_client_certificates_a_client_without_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let mut files = server_files(&certs);
    files.client_ca = Some(certs.join("client-ca.pem"));
    files.require_client_cert = true;
    let mut config = storage::Config::new(dir.path().join("data"));
    config.tls = Some(files.clone());
    let s = TlsServer::start(config).await;
    let anonymous = client_tls(&certs.join("ca.pem"), None);
    let certified = client_tls(&certs.join("ca.pem"), Some(&certs));

    let refused = tls_put(s.addr, &anonymous, "doc", 5, "anon").await;
    assert!(refused.is_err(), "a client without a certificate was served: {refused:?}");
    assert_eq!(tls_mark(s.addr, &certified, "doc").await, Value::Null, "the refused PUT did nothing");
    assert_eq!(tls_put(s.addr, &certified, "doc", 5, "v").await.unwrap().status, 201);
    s.shutdown().await;

    files.require_client_cert = false;
    let mut config = storage::Config::new(dir.path().join("data2"));
    config.tls = Some(files);
    let s = TlsServer::start(config).await;
    assert_eq!(tls_put(s.addr, &anonymous, "doc", 5, "v").await.unwrap().status, 201);
    assert_eq!(tls_put(s.addr, &certified, "doc", 6, "v").await.unwrap().status, 200);
    s.shutdown().await;
}

/// Rule: a connection that never speaks does not hold a task for ever: over
/// TLS it is closed by the handshake timeout, and one that finishes the
/// handshake but sends no request (or a plaintext one that sends nothing)
/// by the header-read timeout.
#[tokio::test]
async fn silent_connections_are_closed_by_the_handshake_and_header_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let short = Duration::from_millis(300);
    let limit = Duration::from_secs(5);
    let mut config = storage::Config::new(dir.path().join("data"));
    config.tls = Some(server_files(&certs));
    config.handshake_timeout = short;
    config.header_read_timeout = Duration::from_millis(600);
    let s = TlsServer::start(config).await;

    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    let took = closed_within(&mut silent, limit).await;
    assert!(took >= short - Duration::from_millis(50), "closed before the timeout: {took:?}");

    let tls = client_tls(&certs.join("ca.pem"), None);
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let mut quiet = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(ServerName::IpAddress(s.addr.ip().into()), tcp)
        .await
        .expect("the handshake itself is served");
    let took = closed_within(&mut quiet, limit).await;
    assert!(took >= Duration::from_millis(500), "closed before the header timeout: {took:?}");
    assert_eq!(tls_put(s.addr, &tls, "doc", 1, "v").await.unwrap().status, 201, "still serving");
    s.shutdown().await;

    let mut config = storage::Config::new(dir.path().join("plain"));
    config.header_read_timeout = short;
    let s = TlsServer::start(config).await;
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    closed_within(&mut silent, limit).await;
    s.shutdown().await;
}

/// Rule: plaintext on an address other hosts can reach is refused, naming
/// the way out, and nothing is written; `insecure` (`--insecure`) or TLS
/// allow it.
#[tokio::test]
async fn plaintext_off_loopback_is_refused_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let served = storage::serve_with(listener, storage::Config::new(&data), std::future::pending());
    let err = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("plaintext on 0.0.0.0 must be refused at once, not served")
        .expect_err("plaintext on 0.0.0.0 must be refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let msg = err.to_string();
    assert!(msg.contains("TLS is off") && msg.contains("--insecure") && msg.contains("--tls-cert"), "{msg}");
    assert!(!data.exists(), "nothing is written for a refused start");

    let mut config = storage::Config::new(&data);
    config.insecure = true;
    let s = TlsServer::start_on("0.0.0.0:0", config).await;
    let local = SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    let health = try_request(local, "GET", "/healthz", &[], b"").await.unwrap();
    assert_eq!(health.status, 200);
    s.shutdown().await;

    let certs = certs(&dir.path().join("certs"));
    let mut config = storage::Config::new(dir.path().join("tls"));
    config.tls = Some(server_files(&certs));
    let s = TlsServer::start_on("0.0.0.0:0", config).await;
    let local = SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    let tls = client_tls(&certs.join("ca.pem"), None);
    let (health, _) = tls_request(local, &tls, "GET", "/healthz", &[], b"").await.unwrap();
    assert_eq!(health.status, 200, "TLS needs no --insecure");
    s.shutdown().await;
}

/// `src` written next to `dst` and renamed over it, as an operator (or
/// cert-manager) replaces a certificate.
fn replace_by_rename(src_text: &[u8], dst: &Path) {
    let tmp = dst.with_extension("new");
    std::fs::write(&tmp, src_text).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
}

/// Rule: certificate files replaced by rename are used by new connections
/// without a restart; a replacement that does not load is logged and the
/// old certificate stays in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_replaced_by_rename_are_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = certs(&dir.path().join("old"));
    let new = certs(&dir.path().join("new"));
    let served = dir.path().join("served");
    std::fs::create_dir(&served).unwrap();
    let (cert, key) = (served.join("cert.pem"), served.join("key.pem"));
    std::fs::copy(old.join("node1.pem"), &cert).unwrap();
    std::fs::copy(old.join("node1.key"), &key).unwrap();
    let mut config = storage::Config::new(dir.path().join("data"));
    config.tls = Some(storage::TlsFiles::new(&cert, &key));
    let s = TlsServer::start(config).await;
    let (by_old, by_new) = (client_tls(&old.join("ca.pem"), None), client_tls(&new.join("ca.pem"), None));
    let addr = s.addr;
    let healthy = |tls: Arc<rustls::ClientConfig>| async move {
        tls_request(addr, &tls, "GET", "/healthz", &[], b"").await.is_ok()
    };
    assert!(healthy(by_old.clone()).await, "the first certificate is served");
    assert!(!healthy(by_new.clone()).await, "the new CA does not know it yet");

    // A broken file: logged, the old certificate stays.
    replace_by_rename(b"not a certificate", &cert);
    tokio::time::sleep(storage::RELOAD_EVERY * 3).await;
    assert!(healthy(by_old.clone()).await, "a certificate that does not load replaces nothing");

    replace_by_rename(&std::fs::read(new.join("node1.key")).unwrap(), &key);
    replace_by_rename(&std::fs::read(new.join("node1.pem")).unwrap(), &cert);
    let start = Instant::now();
    while !healthy(by_new.clone()).await {
        assert!(start.elapsed() < Duration::from_secs(10), "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!healthy(by_old).await, "new connections get the new certificate");
    s.shutdown().await;
}

/// Rule: `lock_server` may be an `https://` lock service whose `/metrics`
/// needs credentials: with its CA and a bearer token the storage server
/// learns the count (a token never issued is refused with 400, an issued one
/// admitted); without the token it cannot ask and fails closed (503, the
/// reason named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_lock_service_is_asked_with_its_ca_and_a_token() {
    use fencelock::{Client, ClientTls, Outcome};
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let issued = fencelock_server::auth::new_token().unwrap();
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "protect_metrics = true\n\n[[tokens]]\nname = \"storage\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"admin\"]\n",
            issued.id, issued.hash
        ),
    )
    .unwrap();
    let mut lock_config = fencelock_server::Config::for_test(dir.path().join("lock"));
    lock_config.tls = Some(fencelock_server::tls::TlsFiles {
        cert: certs.join("node1.pem"),
        key: certs.join("node1.key"),
        ca: certs.join("ca.pem"),
        client_ca: None,
        require_client_cert: false,
    });
    lock_config.auth_file = Some(auth);
    let lock = fencelock_server::start(lock_config).await.unwrap();
    let client = Client::builder(format!("https://{}", lock.grpc_addr))
        .tls(ClientTls::from_files(&certs.join("ca.pem"), None, None).unwrap())
        .token(issued.token.clone())
        .connect()
        .await
        .unwrap();
    let start = Instant::now();
    let grant = loop {
        match client.lock("doc-lock").ttl(Duration::from_secs(10)).acquire().await {
            Ok(Outcome::Acquired(g)) => break g,
            other if start.elapsed() > Duration::from_secs(20) => panic!("no grant: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let t = grant.token().unwrap();
    let to_lock = client_tls(&certs.join("ca.pem"), None);

    let mut config = storage::Config::new(dir.path().join("storage"));
    config.lock_server = Some(format!("https://{}", lock.http_addr));
    config.lock_server_tls = Some(to_lock.clone());
    config.lock_server_token = Some(issued.token.clone());
    config.token_margin = 0;
    assert!(!format!("{config:?}").contains(&issued.token), "the token is not in the Debug");
    let s = TlsServer::start(config).await;
    let plain = |addr, token: u64| async move {
        try_request(addr, "PUT", "/objects/doc", &fenced(&token.to_string()), b"v").await.unwrap()
    };
    let r = plain(s.addr, t + 1).await;
    assert_eq!(r.status, 400, "the count was read over TLS with the token: {:?}", r.json());
    assert_eq!(r.json()["limit"], json!(t));
    assert_eq!(plain(s.addr, t).await.status, 201);
    s.shutdown().await;

    let mut config = storage::Config::new(dir.path().join("storage2"));
    config.lock_server = Some(format!("https://{}", lock.http_addr));
    config.lock_server_tls = Some(to_lock);
    config.token_margin = 0;
    let s = TlsServer::start(config).await;
    let r = plain(s.addr, t).await;
    assert_eq!(r.status, 503, "{:?}", r.json());
    let why = r.json()["error"].as_str().unwrap().to_string();
    assert!(why.contains("401") && why.contains("--lock-server-token"), "{why}");
    s.shutdown().await;
    drop(grant);
    lock.shutdown().await;
}

/// Rule: a TLS file that does not load stops the start with an error that
/// names the file and what is wrong (missing, not PEM, a key that is not
/// the certificate's), and nothing is written.
#[tokio::test]
async fn tls_files_that_do_not_load_are_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(&dir.path().join("certs"));
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello").unwrap();
    let data = dir.path().join("data");
    let start = |files: storage::TlsFiles| {
        let data = data.clone();
        async move {
            let mut config = storage::Config::new(&data);
            config.tls = Some(files);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let served = storage::serve_with(listener, config, std::future::pending());
            tokio::time::timeout(Duration::from_secs(5), served)
                .await
                .expect("must fail at once, not serve")
                .expect_err("must not start")
                .to_string()
        }
    };
    let missing = dir.path().join("missing.pem");
    let e = start(storage::TlsFiles::new(&missing, certs.join("node1.key"))).await;
    assert!(e.contains(&missing.display().to_string()) && e.contains("cannot read the certificate"), "{e}");
    let e = start(storage::TlsFiles::new(&garbage, certs.join("node1.key"))).await;
    assert!(e.contains(&garbage.display().to_string()) && e.contains("holds no PEM certificate"), "{e}");
    let e = start(storage::TlsFiles::new(certs.join("node1.pem"), &garbage)).await;
    assert!(e.contains(&garbage.display().to_string()) && e.contains("holds no PEM private key"), "{e}");
    let e = start(storage::TlsFiles::new(certs.join("node1.pem"), certs.join("client.key"))).await;
    assert!(e.contains("does not match") && e.contains("client.key") && e.contains("node1.pem"), "{e}");
    let mut files = server_files(&certs);
    files.client_ca = Some(garbage.clone());
    let e = start(files).await;
    assert!(e.contains("client CA") && e.contains(&garbage.display().to_string()), "{e}");
    assert!(!data.exists(), "nothing is written for a refused start");
}
