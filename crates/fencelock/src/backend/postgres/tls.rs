//! TLS for the PostgreSQL backend, as libpq's `sslmode` and `sslrootcert`
//! say, on tokio-rustls: [`PgConfig`] is tokio-postgres's `Config` with the
//! TLS connector it must use, and [`PgTls`] the connector
//! (tokio-postgres's `MakeTlsConnect`).
//!
//! | `sslmode` | TLS | server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default, as libpq) | if the server offers it | not checked |
//! | `require` | always | not checked (as libpq; checked like `verify-ca` when `sslrootcert=` is given) |
//! | `verify-ca` | always | chains to `sslrootcert=` (else the system's CAs) |
//! | `verify-full` | always | chains, and names the URL's host |
//!
//! `require` encrypts but does not authenticate the server: anyone on the
//! path can answer. Use `verify-full` against an attacker on the network.
//! SCRAM channel binding is not offered (the connection is authenticated by
//! the certificate check, not by the password exchange).

use std::future::Future;
use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::{Client, Connection, Socket};
use tokio_rustls::TlsConnector;

use crate::backend::tls::{client_config, read_certs, TlsFiles, Verify, SYSTEM_CA_FILE};
use crate::backend::BackendUrl;
use crate::error::Error;

/// The URL parameters this module reads (and removes before tokio-postgres
/// parses the rest).
pub(super) const PARAMS: [&str; 2] = ["sslmode", "sslrootcert"];

/// tokio-postgres's connection config and the TLS connector it connects with.
#[derive(Clone)]
pub(crate) struct PgConfig {
    config: tokio_postgres::Config,
    tls: PgTls,
}

impl Deref for PgConfig {
    type Target = tokio_postgres::Config;

    fn deref(&self) -> &tokio_postgres::Config {
        &self.config
    }
}

impl PgConfig {
    /// `config` with the `sslmode` and `sslrootcert` of `url`.
    /// [`Error::InvalidArgument`] for an unknown mode, [`Error::Security`]
    /// for a CA file that cannot be read.
    pub fn new(mut config: tokio_postgres::Config, url: &BackendUrl) -> Result<PgConfig, Error> {
        let root = url.param("sslrootcert");
        let (mode, verify) = match url.param("sslmode").unwrap_or("prefer") {
            "disable" => (SslMode::Disable, Verify::Nothing),
            "prefer" | "allow" => (SslMode::Prefer, Verify::Nothing),
            "require" if root.is_some() => (SslMode::Require, Verify::Chain),
            "require" => (SslMode::Require, Verify::Nothing),
            "verify-ca" => (SslMode::Require, Verify::Chain),
            "verify-full" => (SslMode::Require, Verify::Full),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "postgres: sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        };
        config.ssl_mode(mode);
        let ca_pem = match verify {
            Verify::Nothing => Vec::new(),
            _ => read_certs(std::path::Path::new(root.unwrap_or(SYSTEM_CA_FILE)))?,
        };
        let rustls = client_config(&TlsFiles { ca_pem, identity: None }, verify)?;
        Ok(PgConfig { config, tls: PgTls(TlsConnector::from(Arc::new(rustls))) })
    }

    /// The mutable tokio-postgres config (for defaults added after parsing).
    pub fn inner_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }

    /// Connects with this config's TLS (no timeout: callers bound it).
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, PgStream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    /// The TLS connector (for cancel requests, which open a connection).
    pub fn tls(&self) -> PgTls {
        self.tls.clone()
    }
}

/// tokio-postgres's TLS hook on tokio-rustls.
#[derive(Clone)]
pub(crate) struct PgTls(TlsConnector);

impl MakeTlsConnect<Socket> for PgTls {
    type Stream = PgStream;
    type TlsConnect = PgConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgConnect, io::Error> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{domain:?} is no server name: {e}")))?;
        Ok(PgConnect { connector: self.0.clone(), name })
    }
}

/// One TLS handshake to come, with the host name to check.
pub(crate) struct PgConnect {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for PgConnect {
    type Stream = PgStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgStream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move { Ok(PgStream(self.connector.connect(self.name, socket).await?)) })
    }
}

/// A TLS connection to the server.
pub(crate) struct PgStream(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for PgStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for PgStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
