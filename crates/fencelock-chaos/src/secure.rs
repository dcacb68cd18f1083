//! A native lock server run with TLS and authentication (P2, and `run --tls`):
//! certificates from [`fencelock_server::certs::init`] (a cluster CA, node 1's
//! certificate, a client CA and one client certificate), an auth file with one
//! bearer token of the `admin` role, and how the harness reaches the server:
//! workers through `fencelock+tls://…?ca=…&token=…`, the admin port over TLS
//! with the token ([`crate::http::use_tls`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use fencelock_proto::raft::raft_client::RaftClient;
use fencelock_server::certs::files;
use rustls::pki_types::pem::PemObject;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The files and token of one run's TLS server.
#[derive(Debug, Clone)]
pub struct Secure {
    /// What `certs::init` wrote.
    pub certs: PathBuf,
    pub auth_file: PathBuf,
    /// The bearer token (role `admin`): never printed.
    pub token: String,
}

/// Who a forged Raft message comes from: never a member of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// A TLS connection without a client certificate.
    NoCert,
    /// A TLS connection with the client certificate of the client CA.
    ClientCert,
}

impl Secure {
    /// Writes the certificates and the auth file under `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Secure> {
        let certs = dir.join("certs");
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        fencelock_server::certs::init(&certs, 1, &hosts).context("make the run's certificates")?;
        let t = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
        let auth_file = dir.join("auth.toml");
        let text = format!("[[tokens]]\nname = \"chaos\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"admin\"]\n", t.id, t.hash);
        std::fs::write(&auth_file, text).with_context(|| format!("write {}", auth_file.display()))?;
        Ok(Secure { certs, auth_file, token: t.token })
    }

    pub fn ca(&self) -> PathBuf {
        self.certs.join(files::CA)
    }

    /// The client URL of the server at `grpc`.
    pub fn url(&self, grpc: SocketAddr) -> String {
        format!("fencelock+tls://{grpc}?ca={}&token={}", self.ca().display(), self.token)
    }

    /// Arguments of `fencelock-chaos serve` for node 1.
    pub fn serve_args(&self) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        vec!["--tls-dir".into(), s(&self.certs), "--auth-file".into(), s(&self.auth_file)]
    }

    /// Admin requests to `admin` go over TLS with the token.
    pub fn register_admin(&self, admin: SocketAddr) -> anyhow::Result<()> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(self.ca()).with_context(|| format!("read {}", self.ca().display()))?;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.context("the CA file")?).context("the CA certificate")?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        crate::http::use_tls(admin, Arc::new(config), self.token.clone());
        Ok(())
    }

    /// A Raft client of the server at `grpc` that trusts its CA and presents
    /// `sender`'s identity (never a node certificate).
    pub async fn raft_client(&self, grpc: SocketAddr, sender: Sender) -> anyhow::Result<RaftClient<Channel>> {
        let read = |name: &str| std::fs::read(self.certs.join(name)).with_context(|| format!("read {name}"));
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(files::CA)?));
        if sender == Sender::ClientCert {
            tls = tls.identity(Identity::from_pem(read(files::CLIENT)?, read(files::CLIENT_KEY)?));
        }
        let ch = Endpoint::from_shared(format!("https://{grpc}"))?.tls_config(tls)?.connect().await?;
        Ok(RaftClient::new(ch))
    }
}

/// `serve --tls-dir DIR --auth-file F`: node 1's certificate of `DIR`, the
/// cluster CA, the client CA (client certificates optional), the auth file.
pub fn server_config(config: &mut fencelock_server::Config, tls_dir: &Path, auth_file: Option<&Path>) {
    let (cert, key) = files::node(1);
    config.tls = Some(fencelock_server::tls::TlsFiles {
        cert: tls_dir.join(cert),
        key: tls_dir.join(key),
        ca: tls_dir.join(files::CA),
        client_ca: Some(tls_dir.join(files::CLIENT_CA)),
        require_client_cert: false,
    });
    config.auth_file = auth_file.map(Path::to_path_buf);
}
