//! Certificates for a group: a cluster CA and a certificate per node, a
//! client CA and a client certificate (rcgen, ECDSA P-256). What
//! `fencelock certs init` writes, and what the TLS tests use.
//!
//! Where it sits: nothing here runs in a serving node; [`crate::access::tls`] reads
//! the files these functions write. Node certificates are for both ends of a
//! TLS connection (server and client authentication), because a node presents
//! its certificate to its peers when it dials them.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// How long a CA certificate is valid.
const CA_DAYS: i64 = 3650;
/// How long a node or client certificate is valid.
const LEAF_DAYS: i64 = 825;

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertsError {
    #[error("cannot make the certificate: {0}")]
    Make(#[from] rcgen::Error),
    #[error("{0} exists already; remove it or pick another --dir")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// A certificate authority that signs certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A node: server and client authentication.
    Node,
    /// A client: client authentication only.
    Client,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Ca, CertsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = named(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        valid_for(&mut params, CA_DAYS);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Ca { issuer })
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `name`, valid for the host names and addresses in
    /// `hosts` (DNS names or IP addresses), signed by this CA.
    #[allow(clippy::disallowed_methods)] // a certificate's validity is wall-clock time
    pub fn issue(&self, name: &str, hosts: &[String], role: Role) -> Result<Issued, CertsError> {
        let now = SystemTime::now();
        let days = Duration::from_secs(LEAF_DAYS as u64 * 86_400);
        self.issue_valid(name, hosts, role, now - Duration::from_secs(3600), now + days)
    }

    /// [`Ca::issue`], valid from `not_before` to `not_after` (a certificate
    /// that expired, or is not valid yet, for tests of the handshake).
    pub fn issue_valid(
        &self,
        name: &str,
        hosts: &[String],
        role: Role,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Issued, CertsError> {
        let mut params = CertificateParams::new(hosts.to_vec())?;
        params.distinguished_name = named(name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = match role {
            Role::Node => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        params.not_before = time::OffsetDateTime::from(not_before);
        params.not_after = time::OffsetDateTime::from(not_after);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn named(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// Valid from an hour ago (clocks of the hosts differ) for `days`.
#[allow(clippy::disallowed_methods)] // a certificate's validity is wall-clock time
fn valid_for(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::from(SystemTime::now());
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

/// The files of a group made by [`init`], relative to its directory.
pub mod files {
    pub const CA: &str = "ca.pem";
    pub const CA_KEY: &str = "ca.key";
    pub const CLIENT_CA: &str = "client-ca.pem";
    pub const CLIENT_CA_KEY: &str = "client-ca.key";
    pub const CLIENT: &str = "client.pem";
    pub const CLIENT_KEY: &str = "client.key";

    /// `node{id}.pem` and `node{id}.key`.
    pub fn node(id: u64) -> (String, String) {
        (format!("node{id}.pem"), format!("node{id}.key"))
    }
}

/// Writes into `dir` (created if missing) a cluster CA, a certificate for
/// each of nodes `1..=nodes` valid for `hosts`, a client CA and one client
/// certificate named `client`. Refuses to overwrite any file. Keys are
/// written readable by their owner only. Returns the files written.
pub fn init(dir: &Path, nodes: u64, hosts: &[String]) -> Result<Vec<PathBuf>, CertsError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let cluster = Ca::new("fencelock cluster CA")?;
    out.push((files::CA.into(), cluster.cert_pem()));
    out.push((files::CA_KEY.into(), cluster.issuer.key().serialize_pem()));
    for id in 1..=nodes {
        let node = cluster.issue(&format!("fencelock node {id}"), hosts, Role::Node)?;
        let (cert, key) = files::node(id);
        out.push((cert, node.cert_pem));
        out.push((key, node.key_pem));
    }
    let clients = Ca::new("fencelock client CA")?;
    let client = clients.issue("client", &[], Role::Client)?;
    out.push((files::CLIENT_CA.into(), clients.cert_pem()));
    out.push((files::CLIENT_CA_KEY.into(), clients.issuer.key().serialize_pem()));
    out.push((files::CLIENT.into(), client.cert_pem));
    out.push((files::CLIENT_KEY.into(), client.key_pem));
    write_all(dir, &out)
}

fn write_all(dir: &Path, files: &[(String, String)]) -> Result<Vec<PathBuf>, CertsError> {
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertsError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(werr(dir))?;
    let paths: Vec<PathBuf> = files.iter().map(|(name, _)| dir.join(name)).collect();
    if let Some(p) = paths.iter().find(|p| p.exists()) {
        return Err(CertsError::Exists(p.clone()));
    }
    for (path, (name, pem)) in paths.iter().zip(files) {
        write_file(path, pem, name.ends_with(".key")).map_err(werr(path))?;
    }
    Ok(paths)
}

fn write_file(path: &Path, text: &str, secret: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}
