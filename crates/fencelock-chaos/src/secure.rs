//! fencelock run with TLS and authentication (P2, and `run --tls`, a single
//! node or a 3-node group): certificates from [`fencelock_server::certs::init`]
//! (a cluster CA, a certificate for each of three nodes, a client CA and one
//! client certificate), an auth file with two bearer tokens, and how the
//! harness reaches the service:
//! - workers, and the harness's own lock clients (S1's holder and waiter),
//!   as identity `chaos-worker`: role `chaos-worker`, `acquire`, `check` and
//!   `read` on the lock names starting with [`WORKER_PREFIX`], nothing else
//!   (least privilege), through `fencelock+tls://…?ca=…&token=…`;
//! - the harness's admin calls (`/v1/cluster`, `/v1/locks/…`, membership) as
//!   identity `chaos-admin` (role `admin`), over TLS
//!   ([`crate::http::use_tls`]);
//! - nodes of a group speak Raft to each other on a peer port of their own,
//!   each presenting its node certificate of the cluster CA;
//! - every node keeps an audit log; at the end [`audit_note`] counts the calls
//!   it refused, which fail the run (A1): no scenario may pass because auth
//!   stopped its work.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use fencelock_proto::raft::raft_client::RaftClient;
use fencelock_server::certs::files;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::history::{Event, Op};

/// The lock names the workers' identity may acquire, check and read: the
/// run's lock ([`crate::scenario::LOCK`]) and S1's trial locks.
pub const WORKER_PREFIX: &str = crate::scenario::LOCK;

/// How the lock service's audit logs end, in the run's directory
/// (`lock-audit.log`, `node2-audit.log`).
pub const AUDIT_SUFFIX: &str = "-audit.log";

/// Node certificates made per run: enough for a 3-node group, and for P1 to
/// speak as a member (node 2) to a single node 1.
const NODES: u64 = 3;

/// The files and tokens of one run's TLS service.
#[derive(Debug, Clone)]
pub struct Secure {
    /// What `certs::init` wrote.
    pub certs: PathBuf,
    pub auth_file: PathBuf,
    /// The bearer token of role `admin`, for the harness's admin calls: never printed.
    pub admin_token: String,
    /// The bearer token of the workers (role `chaos-worker`): never printed.
    pub worker_token: String,
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
        fencelock_server::certs::init(&certs, NODES, &hosts).context("make the run's certificates")?;
        let admin = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
        let worker = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
        let auth_file = dir.join("auth.toml");
        std::fs::write(&auth_file, auth_file_text(&admin, &worker))
            .with_context(|| format!("write {}", auth_file.display()))?;
        Ok(Secure { certs, auth_file, admin_token: admin.token, worker_token: worker.token })
    }

    pub fn ca(&self) -> PathBuf {
        self.certs.join(files::CA)
    }

    /// The workers' URL of the service at `grpc` (one node, or every node of
    /// a group): TLS, the worker token.
    pub fn url(&self, grpc: &[SocketAddr]) -> String {
        let hosts: Vec<String> = grpc.iter().map(SocketAddr::to_string).collect();
        format!("fencelock+tls://{}?ca={}&token={}", hosts.join(","), self.ca().display(), self.worker_token)
    }

    /// Arguments of `fencelock-chaos serve` for TLS, the auth file (each node
    /// presents the certificate of its `--node-id`) and an audit log, which
    /// must be named `*AUDIT_SUFFIX` in the run's directory for
    /// [`audit_note`] to read it.
    pub fn serve_args(&self, audit_log: &Path) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        let mut args = vec!["--tls-dir".into(), s(&self.certs), "--auth-file".into(), s(&self.auth_file)];
        args.extend(["--audit-log".into(), s(audit_log)]);
        args
    }

    /// Admin requests to `admin` go over TLS with the admin token.
    pub fn register_admin(&self, admin: SocketAddr) -> anyhow::Result<()> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(self.ca()).with_context(|| format!("read {}", self.ca().display()))?;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.context("the CA file")?).context("the CA certificate")?;
        }
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        crate::http::use_tls(admin, Arc::new(config), self.admin_token.clone());
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

    /// A Raft client of the server at `grpc` that presents the certificate of
    /// node `id` of the cluster CA: a member, as far as the membership check
    /// can tell (P1 under TLS).
    pub async fn member_raft_client(&self, grpc: SocketAddr, id: u64) -> anyhow::Result<RaftClient<Channel>> {
        let read = |name: &str| std::fs::read(self.certs.join(name)).with_context(|| format!("read {name}"));
        let (cert, key) = files::node(id);
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(files::CA)?))
            .identity(Identity::from_pem(read(&cert)?, read(&key)?));
        let ch = Endpoint::from_shared(format!("https://{grpc}"))?.tls_config(tls)?.connect().await?;
        Ok(RaftClient::new(ch))
    }
}

/// What the service's audit logs under `out` say was refused (unauthenticated,
/// denied, over a limit): the harness's `auth-audit` note for A1. The nodes
/// write their lines out every second: call this a second after the last call.
pub fn audit_note(out: &Path) -> Event {
    let note = Event::note("harness", Op::AuthAudit);
    match refusals(out) {
        Ok((files, lines)) => {
            let examples: Vec<&String> = lines.iter().take(5).collect();
            Event { count: Some(lines.len() as u64), detail: json!({ "files": files, "examples": examples }), ..note }
        }
        Err(e) => Event { detail: json!({ "error": format!("{e:#}") }), ..note },
    }
}

/// The audit logs read, and their lines of refused calls.
fn refusals(out: &Path) -> anyhow::Result<(usize, Vec<String>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(AUDIT_SUFFIX)))
        .collect();
    anyhow::ensure!(!files.is_empty(), "no *{AUDIT_SUFFIX} in {}", out.display());
    files.sort();
    let mut refused = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        for line in text.lines() {
            let v: serde_json::Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(_) => continue, // a line torn by a kill
            };
            if matches!(v["outcome"].as_str(), Some("unauthenticated" | "denied" | "limited")) {
                refused.push(line.to_string());
            }
        }
    }
    Ok((files.len(), refused))
}

/// The auth file: the admin token, and the worker token whose role may only
/// acquire, check and read locks under [`WORKER_PREFIX`].
fn auth_file_text(admin: &fencelock_server::auth::NewToken, worker: &fencelock_server::auth::NewToken) -> String {
    format!(
        "[roles.chaos-worker]\nrules = [{{ prefix = \"{WORKER_PREFIX}\", verbs = [\"acquire\", \"check\", \"read\"] }}]\n\n\
         [[tokens]]\nname = \"chaos-admin\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"admin\"]\n\n\
         [[tokens]]\nname = \"chaos-worker\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"chaos-worker\"]\n",
        admin.id, admin.hash, worker.id, worker.hash
    )
}

/// `serve --tls-dir DIR --auth-file F` of node `id`: its certificate of
/// `DIR`, the cluster CA, the client CA (client certificates optional), the
/// auth file.
pub fn server_config(config: &mut fencelock_server::Config, tls_dir: &Path, id: u64, auth_file: Option<&Path>) {
    let (cert, key) = files::node(id);
    config.tls = Some(fencelock_server::tls::TlsFiles {
        cert: tls_dir.join(cert),
        key: tls_dir.join(key),
        ca: tls_dir.join(files::CA),
        client_ca: Some(tls_dir.join(files::CLIENT_CA)),
        require_client_cert: false,
    });
    config.auth_file = auth_file.map(Path::to_path_buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_server::auth::{Auth, Verb};

    /// The workers' token may acquire, check and read the run's locks and
    /// nothing else; the admin token may change the group.
    #[test]
    fn the_worker_token_has_least_privilege() {
        let dir = tempfile::tempdir().unwrap();
        let s = Secure::create(dir.path()).unwrap();
        let auth = Auth::load(&s.auth_file).unwrap();
        let worker = auth.authenticate(Some(&format!("Bearer {}", s.worker_token)), None).unwrap();
        for verb in [Verb::Acquire, Verb::Check, Verb::Read] {
            assert!(worker.require(verb, crate::scenario::LOCK).is_ok(), "{verb}");
            assert!(worker.require(verb, "chaos-s1-7").is_ok(), "{verb} on a trial lock");
            assert!(worker.require(verb, "other").is_err(), "{verb} outside the prefix");
        }
        assert!(worker.require_admin().is_err(), "the workers are not admins");
        let admin = auth.authenticate(Some(&format!("Bearer {}", s.admin_token)), None).unwrap();
        assert!(admin.require_admin().is_ok());
        assert!(s.url(&["127.0.0.1:1".parse().unwrap()]).contains(&s.worker_token));
    }
}
