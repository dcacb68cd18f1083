//! TLS on the storage server's listener (rustls on ring; no OpenSSL), and
//! the reload of its certificate files.
//!
//! The conventions are the fencelock node's (`fencelock serve --tls-cert`):
//! the certificate and key (PEM) are this server's; a client CA, if given,
//! verifies client certificates, which are optional unless
//! [`TlsFiles::require_client_cert`]. The files are read again when they
//! change (their modification time, size or inode, checked every
//! [`RELOAD_EVERY`]): a new handshake uses the new certificate, open
//! connections are not touched, and a file that does not load is logged
//! (once per change) while the last good configuration stays in use. Replace
//! the files by rename, so that no handshake reads a half-written one.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};

/// How often the certificate files are checked for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The storage server's certificate files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA of client certificates: clients may present one (mTLS).
    pub client_ca: Option<PathBuf>,
    /// Refuse a connection without a client certificate of `client_ca`.
    pub require_client_cert: bool,
}

impl TlsFiles {
    /// The certificate and key, no client certificates.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self { cert: cert.into(), key: key.into(), client_ca: None, require_client_cert: false }
    }
}

/// Why the TLS files cannot be used. Each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file cannot be read (missing, a directory, no permission).
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        /// Which file: "certificate", "private key", "client CA".
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not PEM, or holds no certificate (or key) that can be
    /// parsed.
    #[error("the {what} {} holds no PEM {expected} ({source})", path.display())]
    NotPem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What was expected in it.
        expected: &'static str,
        /// The parser's complaint.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate of the client CA cannot be a trust anchor.
    #[error("the client CA {} is not usable: {source}", path.display())]
    BadCa {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The client certificate verifier cannot be built from the client CA.
    #[error("the client CA {}: {source}", path.display())]
    Verifier {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: rustls::server::VerifierBuilderError,
    },
    /// The key is not the certificate's.
    #[error("the private key {} does not match the certificate {}", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// Certificate and key do not make a configuration for another reason.
    #[error("the certificate {} and key {} do not make a TLS configuration: {source}", cert.display(), key.display())]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// `require_client_cert` without a client CA to verify them with.
    #[error("requiring client certificates needs a client CA (--client-ca)")]
    NoClientCa,
}

/// The listener's TLS: the files and the configuration loaded from them.
pub(crate) struct ServerTls {
    files: TlsFiles,
    loaded: RwLock<Loaded>,
    /// The stamps of a loading that failed, so that it is logged once.
    failed: Mutex<Option<Stamps>>,
}

struct Loaded {
    config: Arc<ServerConfig>,
    stamps: Stamps,
}

/// Modification time, size and inode of each file when read.
type Stamps = Vec<Option<(SystemTime, u64, u64)>>;

impl ServerTls {
    /// Loads the files; the error names the file and what is wrong with it.
    pub(crate) fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let loaded = load(&files)?;
        Ok(Arc::new(Self { files, loaded: RwLock::new(loaded), failed: Mutex::new(None) }))
    }

    /// The acceptor of a new connection: the configuration in use now.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        tokio_rustls::TlsAcceptor::from(loaded.config.clone())
    }

    /// Reads the files again if any changed since the last loading;
    /// `Ok(true)` if a new configuration is in use. A failure is reported
    /// once per change of the files (`Ok(false)` after that).
    pub(crate) fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files);
        if now == self.loaded.read().unwrap_or_else(|p| p.into_inner()).stamps {
            return Ok(false);
        }
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.as_ref() == Some(&now) {
            return Ok(false);
        }
        match load(&self.files) {
            Ok(loaded) => {
                *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = loaded;
                *failed = None;
                Ok(true)
            }
            Err(e) => {
                *failed = Some(now);
                Err(e)
            }
        }
    }

    /// Reloads on a change of the files, every [`RELOAD_EVERY`], for ever
    /// (the server aborts it when it stops).
    pub(crate) async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificates reloaded")
                }
                Ok(false) => {}
                Err(e) => tracing::error!(
                    error = %e,
                    "TLS certificates not reloaded; the previous ones stay in use"
                ),
            }
        }
    }
}

fn files_of(f: &TlsFiles) -> Vec<&Path> {
    let mut v = vec![f.cert.as_path(), f.key.as_path()];
    v.extend(f.client_ca.as_deref());
    v
}

fn stamps(f: &TlsFiles) -> Stamps {
    files_of(f)
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len(), m.ino()))
        })
        .collect()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_path_buf(), source })
}

/// Every certificate of a PEM file (at least one).
fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let not_pem = |source| TlsError::NotPem { what, path: path.to_path_buf(), expected: "certificate", source };
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(not_pem)?;
    if certs.is_empty() {
        return Err(not_pem(rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let what = "private key";
    let pem = read(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| TlsError::NotPem {
        what,
        path: path.to_path_buf(),
        expected: "private key",
        source,
    })
}

fn load(f: &TlsFiles) -> Result<Loaded, TlsError> {
    // Stamps first: a file replaced while it is read is read again next time.
    let stamps = stamps(f);
    let chain = read_certs("certificate", &f.cert)?;
    let key = read_key(&f.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config { cert: f.cert.clone(), key: f.key.clone(), source })?;
    let builder = match &f.client_ca {
        None if f.require_client_cert => return Err(TlsError::NoClientCa),
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs("client CA", ca)? {
                roots.add(cert).map_err(|source| TlsError::BadCa { path: ca.clone(), source })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier =
                if f.require_client_cert { verifier.build() } else { verifier.allow_unauthenticated().build() };
            let verifier = verifier.map_err(|source| TlsError::Verifier { path: ca.clone(), source })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|source| match source {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            TlsError::KeyMismatch { cert: f.cert.clone(), key: f.key.clone() }
        }
        source => TlsError::Config { cert: f.cert.clone(), key: f.key.clone(), source },
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Loaded { config: Arc::new(config), stamps })
}
