//! TLS for the backends' own connections (Redis, etcd, PostgreSQL): the
//! files a URL names (`ca=`, `cert=`, `key=`, or PostgreSQL's `sslrootcert=`),
//! read and checked once at connect, and the rustls client configuration made
//! from them. rustls on *ring* only: no OpenSSL, no aws-lc.
//!
//! Where it sits: each backend's `connect` calls [`TlsFiles::from_url`]; Redis
//! and etcd hand the PEM bytes to their drivers (which build rustls configs of
//! their own), PostgreSQL uses [`client_config`] through its connector.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::BackendUrl;
use crate::error::Error;

/// Where the system's CAs are when the URL names none (Debian's
/// `ca-certificates`).
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The PEM files of a URL, read: the CAs to verify the server against, and
/// an optional client certificate with its key.
#[derive(Clone)]
pub struct TlsFiles {
    /// The CA certificates (PEM), from `ca=` or the system's.
    pub ca_pem: Vec<u8>,
    /// A client certificate chain and its key (PEM), from `cert=` and `key=`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles").field("identity", &self.identity.is_some()).finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// The files named by `url`'s `ca=`, `cert=` and `key=`, if the URL asks
    /// for TLS (`url.tls`); `None` if it does not. [`Error::InvalidArgument`]
    /// for a file parameter without TLS or a `cert=` without `key=`;
    /// [`Error::Security`] for a file that cannot be read or holds no PEM
    /// certificate (or key).
    pub fn from_url(url: &BackendUrl) -> Result<Option<TlsFiles>, Error> {
        let (ca, cert, key) = (url.param("ca"), url.param("cert"), url.param("key"));
        if !url.tls {
            if let Some(given) = [("ca", ca), ("cert", cert), ("key", key)].iter().find(|(_, v)| v.is_some()) {
                return Err(Error::InvalidArgument(format!(
                    "{url}: {}= is for a TLS connection; use the TLS scheme (fencelock+tls://, rediss://, redlock+tls://, etcd+tls://)",
                    given.0
                )));
            }
            return Ok(None);
        }
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((read_certs(Path::new(cert))?, read_key(Path::new(key))?)),
            _ => return Err(Error::InvalidArgument(format!("{url}: cert= and key= go together"))),
        };
        let ca_pem = read_certs(&ca.map_or_else(|| PathBuf::from(SYSTEM_CA_FILE), PathBuf::from))?;
        Ok(Some(TlsFiles { ca_pem, identity }))
    }

    /// The CAs as a rustls root store.
    pub fn roots(&self) -> Result<RootCertStore, Error> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let cert = cert.map_err(|e| Error::security("tls: a CA certificate cannot be parsed", e))?;
            roots.add(cert).map_err(|e| Error::security("tls: a CA certificate is not a usable trust anchor", e))?;
        }
        Ok(roots)
    }
}

/// The file at `path`, which must hold at least one PEM certificate.
pub fn read_certs(path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => {
            Err(Error::Security { message: format!("tls: {} holds no PEM certificate", path.display()), source: None })
        }
        Err(e) => Err(Error::security(format!("tls: {} is not a PEM certificate file", path.display()), e)),
    }
}

/// The file at `path`, which must hold a PEM private key.
pub fn read_key(path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| Error::security(format!("tls: {} holds no PEM private key", path.display()), e))?;
    Ok(pem)
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::security(format!("tls: cannot read {}", path.display()), e))
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing: the connection is encrypted, but any server can answer
    /// (PostgreSQL's `sslmode=require`, as libpq does without a root cert).
    Nothing,
    /// The chain to a CA, not the host name (`sslmode=verify-ca`).
    Chain,
    /// The chain and the host name (`sslmode=verify-full`).
    Full,
}

/// A rustls client configuration on *ring* that checks what `verify` says
/// against `files`' CAs, and presents `files`' client certificate if any.
pub fn client_config(files: &TlsFiles, verify: Verify) -> Result<rustls::ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::security("tls: no protocol version", e))?;
    let webpki = || {
        WebPkiServerVerifier::builder_with_provider(Arc::new(files.roots()?), provider.clone())
            .build()
            .map_err(|e| Error::security("tls: no usable CA", e))
    };
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Full => webpki()?,
        Verify::Chain => Arc::new(ChainOnly(webpki()?)),
        Verify::Nothing => Arc::new(Anything(provider)),
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    match &files.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Error::security("tls: bad client certificate", e))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::security("tls: bad client key", e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| Error::security("tls: client certificate", e))
        }
    }
}

/// Checks the chain, not the name (`verify-ca`).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Accepts any certificate (but still checks the handshake's signatures, so
/// the session is with the holder of the certificate's key): encryption
/// without authentication of the server.
#[derive(Debug)]
struct Anything(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Anything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The first [`rustls::Error`] in `e`'s chain of sources, if any: what a
/// failed handshake says once a driver wrapped it.
pub fn rustls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(found) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                return Some(found);
            }
        }
        next = err.source();
    }
    None
}
