//! TLS and authentication for tests, set up as a user does it: certificates
//! from `fencelock certs init`, tokens from `fencelock auth add-token`, the
//! `fencelock serve` flags that use them, and a blocking HTTPS request for
//! a TLS node's admin port.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::rustls;

use super::{bin, exchange, stderr, stdout};

/// `fencelock certs init --dir DIR --nodes N`.
pub fn certs_init(dir: &Path, nodes: u64) -> Output {
    Command::new(bin())
        .args(["certs", "init", "--dir", dir.to_str().unwrap(), "--nodes", &nodes.to_string()])
        .output()
        .expect("run fencelock certs init")
}

/// [`certs_init`], which must succeed; returns `dir`.
pub fn make_certs(dir: &Path, nodes: u64) -> PathBuf {
    let out = certs_init(dir, nodes);
    assert!(out.status.success(), "certs init failed: {}", stderr(&out));
    dir.to_path_buf()
}

/// `fencelock <args>` with `FENCELOCK_AUTH_TOKEN` set to `token` (if any).
pub fn fencelock_as(token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).env_remove("FENCELOCK_AUTH_TOKEN").env_remove("FENCELOCK_SERVER");
    if let Some(t) = token {
        cmd.env("FENCELOCK_AUTH_TOKEN", t);
    }
    cmd.output().expect("run fencelock")
}

/// `fencelock auth add-token NAME --role ROLE --file FILE`: the token it prints.
pub fn add_token(file: &Path, name: &str, role: &str) -> String {
    let out = fencelock_as(None, &["auth", "add-token", name, "--role", role, "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "add-token {name}: {}", stderr(&out));
    let token = stdout(&out).trim().to_string();
    assert!(
        token.starts_with("flt_") && !std::fs::read_to_string(file).unwrap().contains(&token),
        "only the hash is stored"
    );
    token
}

/// A role that may read the locks under `jobs/`.
pub const READER_OF_JOBS: &str = "[roles.reader]\nrules = [{ prefix = \"jobs/\", verbs = [\"read\"] }]\n";

/// A node in `dir` whose auth file holds `roles` (TOML) and a token for each
/// `(name, role)` of `tokens`, added before it starts: the node, and the
/// tokens in that order.
pub fn server_with_tokens(dir: &Path, roles: &str, tokens: &[(&str, &str)]) -> (super::Server, Vec<String>) {
    let file = dir.join("auth.toml");
    std::fs::write(&file, roles).unwrap();
    let tokens = tokens.iter().map(|(name, role)| add_token(&file, name, role)).collect();
    let server = super::Server::start_with_flags(dir, &["--auth-file", file.to_str().unwrap()], None);
    (server, tokens)
}

/// The role of [`Secure::client_token`]: locks, but not the group.
const CLIENT_ROLE: &str = "[roles.app]\nrules = [{ prefix = \"\", verbs = [\"acquire\", \"check\", \"read\"] }]\n";

/// A group's certificates and auth file: a token of role `admin` for
/// membership changes and status, and one of role `app` (acquire, check and
/// read on every lock, no admin) for the clients.
pub struct Secure {
    /// What `certs init` wrote: `ca.pem`, `node{id}.pem`/`.key`, `client-ca.pem`…
    pub certs: PathBuf,
    pub auth_file: PathBuf,
    pub admin_token: String,
    pub client_token: String,
    /// Trusts the cluster CA: for the admin ports.
    https: Arc<rustls::ClientConfig>,
}

impl Secure {
    /// Certificates for `nodes` nodes and the auth file, under `dir`.
    pub fn create(dir: &Path, nodes: u64) -> Secure {
        let certs = make_certs(&dir.join("certs"), nodes);
        let auth_file = dir.join("auth.toml");
        std::fs::write(&auth_file, CLIENT_ROLE).expect("write the auth file");
        let admin_token = add_token(&auth_file, "ops", "admin");
        let client_token = add_token(&auth_file, "app", "app");
        let https = trusting(&certs.join("ca.pem"));
        Secure { certs, auth_file, admin_token, client_token, https }
    }

    pub fn ca(&self) -> PathBuf {
        self.certs.join("ca.pem")
    }

    /// `fencelock serve` flags of node `id`: its certificate, the cluster CA,
    /// the client CA, the auth file.
    pub fn serve_args(&self, id: u64) -> Vec<String> {
        let f = |name: String| self.certs.join(name).display().to_string();
        vec![
            "--tls-cert".into(),
            f(format!("node{id}.pem")),
            "--tls-key".into(),
            f(format!("node{id}.key")),
            "--tls-ca".into(),
            f("ca.pem".into()),
            "--client-ca".into(),
            f("client-ca.pem".into()),
            "--auth-file".into(),
            self.auth_file.display().to_string(),
        ]
    }

    /// `GET path` on an admin port over TLS with the admin token: (status, body).
    pub fn admin_get(&self, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
        self.admin_request(addr, "GET", path, b"")
    }

    /// `method path` with a JSON `body` on an admin port over TLS with the
    /// admin token: (status, body).
    pub fn admin_request(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, String)> {
        let headers = [
            ("Authorization", format!("Bearer {}", self.admin_token)),
            ("Content-Type", "application/json".to_string()),
        ];
        https_exchange(addr, &self.https, method, path, &headers, body)
    }
}

/// A client configuration trusting `ca` (the library's, as the CLI builds it).
pub fn trusting(ca: &Path) -> Arc<rustls::ClientConfig> {
    use fencelock::backend::tls::{client_config, read_certs, TlsFiles, Verify};
    let files = TlsFiles { ca_pem: read_certs(ca).expect("read the CA"), identity: None };
    Arc::new(client_config(&files, Verify::Full).expect("a TLS client configuration"))
}

/// One HTTPS/1.1 request with `Connection: close`, blocking: (status, body).
pub fn https_request(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> std::io::Result<(u16, String)> {
    https_exchange(addr, tls, method, path, headers, b"")
}

/// [`https_request`] with a body.
fn https_exchange(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(std::io::Error::other)?;
    exchange(rustls::StreamOwned::new(conn, tcp), addr, method, path, headers, body)
}
