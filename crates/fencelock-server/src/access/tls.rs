//! TLS for the node's listeners and for its connections to peers (rustls on
//! ring; no OpenSSL).
//!
//! Where it sits: [`crate::access::conn_limits`] runs the server side of the handshake
//! on every admitted connection (within the handshake timeout) when the node
//! has a [`ServerTls`]; [`crate::raft::network`] dials peers with
//! [`ServerTls::peer_client`] and refuses Raft calls whose connection did not
//! present a node certificate ([`ServerTls::verify_peer`]).
//!
//! Two trust roots:
//! - the **cluster CA** (`--tls-ca`) signs every node's certificate. Nodes
//!   present their certificate to each other in both directions, and a Raft
//!   call is served only on a connection whose client certificate chains to
//!   this CA: a process without a node certificate cannot speak Raft.
//! - the **client CA** (`--client-ca`, optional) signs client certificates
//!   (mTLS on the client and admin ports). Keep it apart from the cluster CA:
//!   a certificate of the cluster CA is a node's.
//!
//! The files are read again when they change (checked every
//! [`RELOAD_EVERY`]) or on SIGHUP ([`ServerTls::watch`]). A new handshake uses
//! the new certificate; open connections (and the leases on them) are not
//! touched. A file that does not load is logged and the last good
//! configuration stays in use.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, UnixTime},
    server::{danger::ClientCertVerifier, WebPkiClientVerifier},
    RootCertStore, ServerConfig,
};
use tokio::sync::watch;

/// How often the certificate files are checked for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Where the node's certificates are (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (leaf first), for every port and for
    /// dialling peers.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The cluster CA: verifies peers (and is what clients verify this node
    /// with).
    pub ca: PathBuf,
    /// The CA of client certificates, if clients may present one.
    pub client_ca: Option<PathBuf>,
    /// Refuse a client (or admin) connection without a valid client
    /// certificate.
    pub require_client_cert: bool,
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{what} {path} holds no certificate")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("the CA certificate {path} is not usable: {source}")]
    BadCa { path: PathBuf, source: rustls::Error },
    #[error("client certificate verification: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("the certificate {cert} and key {key} do not make a TLS configuration: {source}")]
    Config { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("the peer TLS configuration: {0}")]
    PeerClient(String),
}

/// Which listener a handshake is for: they differ in the protocol they
/// announce (ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// gRPC: HTTP/2 only.
    Grpc,
    /// The admin API: HTTP/1.1.
    Admin,
    /// The peer port (`--peer-listen`): HTTP/2, and only a node certificate
    /// of the cluster CA completes the handshake.
    Peer,
}

/// The node's TLS state: the loaded configuration and where it came from.
pub struct ServerTls {
    files: TlsFiles,
    loaded: RwLock<Arc<Loaded>>,
}

/// One loading of the files.
pub struct Loaded {
    grpc: Arc<ServerConfig>,
    admin: Arc<ServerConfig>,
    peer: Arc<ServerConfig>,
    peer_verifier: Arc<dyn ClientCertVerifier>,
    peer_client: tonic::transport::ClientTlsConfig,
    /// Modification times and sizes the files had when read.
    stamps: Vec<Option<(SystemTime, u64)>>,
    /// Counts loadings; peer channels made under an older one are remade.
    pub generation: u64,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let loaded = load(&files, 1)?;
        Ok(Arc::new(Self { files, loaded: RwLock::new(Arc::new(loaded)) }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The configuration in use now.
    pub fn current(&self) -> Arc<Loaded> {
        self.loaded.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The acceptor of a new connection on `port`.
    pub fn acceptor(&self, port: Port) -> tokio_rustls::TlsAcceptor {
        let l = self.current();
        tokio_rustls::TlsAcceptor::from(match port {
            Port::Grpc => l.grpc.clone(),
            Port::Admin => l.admin.clone(),
            Port::Peer => l.peer.clone(),
        })
    }

    /// The client side of a connection to a peer: the cluster CA, and this
    /// node's certificate to present.
    pub fn peer_client(&self) -> (tonic::transport::ClientTlsConfig, u64) {
        let l = self.current();
        (l.peer_client.clone(), l.generation)
    }

    /// Whether `chain` (leaf first, as the client presented it) is a node
    /// certificate of the cluster CA. A connection without a client
    /// certificate is not a peer.
    pub fn verify_peer(&self, chain: &[CertificateDer<'static>]) -> Result<(), String> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no client certificate".into());
        };
        self.current()
            .peer_verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("not a node certificate of the cluster CA: {e}"))
    }

    /// Reads the files again if any changed since the last loading; `Ok(true)`
    /// if a new configuration is in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = self.current();
        if stamps(&self.files) == now.stamps {
            return Ok(false);
        }
        self.reload(now.generation + 1).map(|()| true)
    }

    fn reload(&self, generation: u64) -> Result<(), TlsError> {
        let loaded = load(&self.files, generation)?;
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(())
    }

    /// Reloads on a change of the files or on SIGHUP until `stop` turns true.
    /// A failed reload is logged; the last good configuration stays.
    pub async fn watch(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tick.tick() => false,
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            let result = if forced {
                let next = self.current().generation + 1;
                self.reload(next).map(|()| true)
            } else {
                self.reload_if_changed()
            };
            match result {
                Ok(true) => tracing::info!(generation = self.current().generation, "TLS certificates reloaded"),
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "TLS certificates not reloaded; the previous ones stay in use"),
            }
        }
    }
}

fn files_of(f: &TlsFiles) -> Vec<&Path> {
    let mut v = vec![f.cert.as_path(), f.key.as_path(), f.ca.as_path()];
    v.extend(f.client_ca.as_deref());
    v
}

fn stamps(f: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    files_of(f)
        .into_iter()
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
        .collect()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read { what, path: path.to_path_buf(), source };
    let certs = CertificateDer::pem_file_iter(path).map_err(read)?.collect::<Result<Vec<_>, _>>().map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_path_buf() });
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Read {
        what: "private key",
        path: path.to_path_buf(),
        source,
    })
}

/// A root store of the CA certificates in `path`.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("CA certificate", path)? {
        roots.add(cert).map_err(|source| TlsError::BadCa { path: path.to_path_buf(), source })?;
    }
    Ok(roots)
}

fn load(f: &TlsFiles, generation: u64) -> Result<Loaded, TlsError> {
    let stamps = stamps(f);
    let chain = read_certs("certificate", &f.cert)?;
    let key = read_key(&f.key)?;
    let cluster = read_roots(&f.ca)?;
    let peer_verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(cluster.clone()), provider()).build()?;
    // On the client and admin ports a client may present a client
    // certificate, or (connecting to peers) a node certificate.
    let mut any = cluster;
    if let Some(ca) = &f.client_ca {
        any.roots.extend(read_roots(ca)?.roots);
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(any), provider());
    let client_verifier =
        if f.require_client_cert { builder.build()? } else { builder.allow_unauthenticated().build()? };
    let server = |alpn: &[&[u8]], verifier: &Arc<dyn ClientCertVerifier>| -> Result<Arc<ServerConfig>, TlsError> {
        let err = |source| TlsError::Config { cert: f.cert.clone(), key: f.key.clone(), source };
        let mut c = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_client_cert_verifier(verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(err)?;
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(c))
    };
    Ok(Loaded {
        grpc: server(&[b"h2"], &client_verifier)?,
        admin: server(&[b"http/1.1"], &client_verifier)?,
        peer: server(&[b"h2"], &peer_verifier)?,
        peer_verifier,
        peer_client: peer_client(f)?,
        stamps,
        generation,
    })
}

fn peer_client(f: &TlsFiles) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| TlsError::PeerClient(format!("{}: {e}", p.display())));
    let identity = tonic::transport::Identity::from_pem(read(&f.cert)?, read(&f.key)?);
    let ca = tonic::transport::Certificate::from_pem(read(&f.ca)?);
    Ok(tonic::transport::ClientTlsConfig::new().ca_certificate(ca).identity(identity))
}
