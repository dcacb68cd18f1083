//! [`ClientTls`]: how the client verifies fencelock servers and, with mTLS,
//! which certificate it presents (rustls on ring, through tonic).
//!
//! Where it sits: [`crate::ClientBuilder::tls`] takes one; [`crate::backend::native::rpc`]
//! dials every `https://` server with it. The backend URL form
//! (`fencelock+tls://a,b,c?ca=…&cert=…&key=…`) builds one in
//! [`crate::backend`].

use std::path::Path;

use crate::backend::tls::{read_certs, read_key, TlsFiles};
use crate::error::Error;

/// The CA that signed the servers' certificates, and optionally this
/// client's certificate and key (all PEM).
///
/// # Examples
///
/// Mutual TLS: the group's CA, and this client's certificate and key. The host
/// names of the URL must be names the servers' certificates carry.
///
/// ```no_run
/// use std::path::Path;
/// use fencelock::{Client, ClientTls};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let tls = ClientTls::from_files(
///     Path::new("/etc/fencelock/ca.pem"),
///     Some(Path::new("/etc/fencelock/client.pem")),
///     Some(Path::new("/etc/fencelock/client-key.pem")),
/// )?;
/// let client = Client::builder("fencelock://lock-1.internal:7070").tls(tls).connect().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ClientTls").field("client_certificate", &self.identity.is_some()).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Servers are verified with the CA certificate(s) in `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self { ca_pem: ca_pem.into(), identity: None }
    }

    /// Presents `cert_pem` (with its `key_pem`) to servers that ask for a
    /// client certificate.
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// From files: the CA, and a client certificate and key if both given.
    /// [`Error::Security`] names a file that cannot be read or holds no PEM
    /// certificate (or key); [`Error::InvalidArgument`] a certificate given
    /// without its key.
    pub fn from_files(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<Self, Error> {
        let tls = ClientTls::new(read_certs(ca)?);
        match (cert, key) {
            (Some(c), Some(k)) => Ok(tls.identity(read_certs(c)?, read_key(k)?)),
            (None, None) => Ok(tls),
            _ => Err(Error::InvalidArgument("a client certificate needs its key, and a key its certificate".into())),
        }
    }

    /// tonic's configuration for one server.
    pub(crate) fn config(&self) -> tonic::transport::ClientTlsConfig {
        let mut c = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            c = c.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        c
    }
}

impl From<TlsFiles> for ClientTls {
    fn from(f: TlsFiles) -> Self {
        ClientTls { ca_pem: f.ca_pem, identity: f.identity }
    }
}
