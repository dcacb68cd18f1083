//! A minimal HTTP/1.1 client for the tools that talk to a node's admin port
//! or to the fenced storage server: the CLI's admin commands and demo, the
//! fenced storage server's check of the lock service's count, the chaos
//! harness and the bench. The one such client of the workspace.
//!
//! One request per connection (`Connection: close`), so a proxy that holds a
//! connection holds exactly one request; over TLS when given a client
//! configuration, with a bearer token when given one. The answer is read
//! until its `Content-Length` is complete, not to the end of the stream: a
//! proxy in between may end the connection with a reset, which can discard
//! bytes not yet read. A chunked answer is read to the end and de-chunked.
//! Connecting, the handshake, sending and reading the whole answer all fall
//! within one timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use crate::error::HttpError;
use crate::url::{Endpoint, Host};
use crate::wire::{self, Request, Response};

/// Requests to one [`Endpoint`]: plain or over TLS, with or without a bearer
/// token, within a timeout, the answer at most so large. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    to: Endpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `Bearer <token>`.
    authorization: Option<String>,
    timeout: Duration,
    max_answer: Option<usize>,
}

impl Client {
    /// The timeout of a client that is not given one.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// Plain HTTP to `to`, within [`Client::DEFAULT_TIMEOUT`], any size of answer.
    pub fn new(to: impl Into<Endpoint>) -> Self {
        Client { to: to.into(), tls: None, authorization: None, timeout: Self::DEFAULT_TIMEOUT, max_answer: None }
    }

    /// Over TLS with `config` (plain with `None`); the certificate must name
    /// the endpoint's host.
    pub fn tls(mut self, config: Option<Arc<rustls::ClientConfig>>) -> Self {
        self.tls = config;
        self
    }

    /// `Authorization: Bearer <token>` on every request. A token that is
    /// empty or has spaces or control characters is refused, unquoted.
    pub fn bearer(mut self, token: &str) -> Result<Self, HttpError> {
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(HttpError::BadToken);
        }
        self.authorization = Some(format!("Bearer {token}"));
        Ok(self)
    }

    /// How long a request may take, from connecting to the answer's end.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest answer read (head included); a larger one is an error.
    pub fn max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = Some(bytes);
        self
    }

    /// Where the requests go.
    pub fn endpoint(&self) -> &Endpoint {
        &self.to
    }

    /// Sends `req` and reads the whole answer, all within the timeout.
    pub async fn send(&self, req: Request<'_>) -> Result<Response, HttpError> {
        let mut headers = req.headers.to_vec();
        headers.extend(self.authorization.iter().map(|a| ("Authorization", a.clone())));
        let msg = wire::head(&self.to.to_string(), &Request { headers: &headers, ..req })?;
        let timed_out = || HttpError::Timeout {
            addr: self.to.clone(),
            method: req.method.into(),
            path: req.path.into(),
            timeout: self.timeout,
        };
        tokio::time::timeout(self.timeout, self.exchange(&req, &msg)).await.map_err(|_| timed_out())?
    }

    async fn exchange(&self, req: &Request<'_>, msg: &[u8]) -> Result<Response, HttpError> {
        let tcp = self.connect().await.map_err(|source| HttpError::Connect { addr: self.to.clone(), source })?;
        let _ = tcp.set_nodelay(true);
        let Some(config) = &self.tls else { return self.talk(tcp, req, msg).await };
        let stream = tokio_rustls::TlsConnector::from(config.clone())
            .connect(self.server_name()?, tcp)
            .await
            .map_err(|source| HttpError::Tls { addr: self.to.clone(), source })?;
        self.talk(stream, req, msg).await
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        match &self.to.host {
            Host::Ip(ip) => TcpStream::connect(SocketAddr::new(*ip, self.to.port)).await,
            Host::Name(name) => TcpStream::connect((name.as_str(), self.to.port)).await,
        }
    }

    /// The name the server's certificate must have: the endpoint's host.
    fn server_name(&self) -> Result<rustls::pki_types::ServerName<'static>, HttpError> {
        match &self.to.host {
            Host::Ip(ip) => Ok(rustls::pki_types::ServerName::IpAddress((*ip).into())),
            Host::Name(name) => rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|source| HttpError::ServerName { addr: self.to.clone(), source }),
        }
    }

    async fn talk(
        &self,
        mut s: impl AsyncRead + AsyncWrite + Unpin,
        req: &Request<'_>,
        msg: &[u8],
    ) -> Result<Response, HttpError> {
        let addr = || self.to.clone();
        let io = |source| HttpError::Io { addr: addr(), method: req.method.into(), path: req.path.into(), source };
        s.write_all(msg).await.map_err(io)?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            if let Some(r) = wire::complete(&raw) {
                return r.map_err(|reason| HttpError::Malformed { addr: addr(), reason });
            }
            let n = s.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                return wire::parse(&raw).map_err(|reason| HttpError::Malformed { addr: addr(), reason });
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(limit) = self.max_answer.filter(|&l| raw.len() > l) {
                return Err(HttpError::TooLarge { addr: addr(), limit });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener on 127.0.0.1:0 that answers each of `answers` to one
    /// connection, in order, after reading its request, and returns the requests.
    async fn serve(answers: Vec<&'static [u8]>) -> (SocketAddr, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for answer in answers {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                s.write_all(answer).await.unwrap();
                // Keep the connection open: the answer is complete by its length.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        });
        (addr, task)
    }

    /// Against a real socket: the answer is complete at its Content-Length
    /// even though the peer keeps the connection open; a listener that never
    /// answers runs into the timeout; a closed port is a connect error.
    #[tokio::test]
    async fn reads_to_the_content_length_and_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong").await.unwrap();
            let (_silent, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let client = Client::new(addr).timeout(Duration::from_secs(5));
        let r = client.send(Request::get("/ping")).await.unwrap();
        assert_eq!((r.status, r.text()), (200, "pong".to_string()));
        let err = client.clone().timeout(Duration::from_millis(200)).send(Request::get("/ping")).await.unwrap_err();
        assert!(matches!(err, HttpError::Timeout { .. }), "{err}");
        server.abort();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let err = Client::new(closed).send(Request::get("/")).await.unwrap_err();
        assert!(matches!(err, HttpError::Connect { .. }) && std::error::Error::source(&err).is_some(), "{err}");
    }

    /// A bearer token goes on every request; one that could not be a header
    /// value is refused without being quoted; a host name is resolved and
    /// is the Host header.
    #[tokio::test]
    async fn sends_the_bearer_token_to_a_named_host() {
        let (addr, server) = serve(vec![b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"]).await;
        let to = Endpoint { host: Host::Name("localhost".into()), port: addr.port() };
        let client = Client::new(to).bearer("flt_abc").unwrap();
        assert_eq!(client.send(Request::get("/metrics")).await.unwrap().status, 204);
        let seen = server.await.unwrap();
        assert!(seen[0].contains("\r\nAuthorization: Bearer flt_abc\r\n"), "{}", seen[0]);
        assert!(seen[0].contains(&format!("\r\nHost: localhost:{}\r\n", addr.port())), "{}", seen[0]);
        for bad in ["", "sekrit sekrit", "sekrit\r\nX: y"] {
            let err = Client::new(addr).bearer(bad).unwrap_err();
            assert!(matches!(err, HttpError::BadToken) && !err.to_string().contains("sekrit"), "{err}");
        }
    }

    /// An answer over the limit is an error, not a cut body.
    #[tokio::test]
    async fn refuses_an_answer_over_the_limit() {
        let (addr, _server) = serve(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n0123456789"]).await;
        let err = Client::new(addr).max_answer(32).send(Request::get("/")).await.unwrap_err();
        assert!(matches!(err, HttpError::TooLarge { limit: 32, .. }), "{err}");
    }

    /// A CA, and a server configuration with a certificate it signed for
    /// `localhost` only; the client configuration that trusts the CA.
    fn localhost_tls() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
        let server =
            rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(vec![cert.der().clone()], key);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        (Arc::new(server.unwrap()), Arc::new(client))
    }

    /// Over TLS the certificate must name the endpoint's host: `localhost`
    /// (a name) is answered; 127.0.0.1 (not in the certificate) fails the
    /// handshake, keeping rustls's error as the source.
    #[tokio::test]
    async fn tls_checks_the_host_name() {
        let (server_config, client_config) = localhost_tls();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
        let server = tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(mut s) = acceptor.accept(tcp).await else { continue };
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
                s.shutdown().await.unwrap();
            }
        });
        let named = Endpoint { host: Host::Name("localhost".into()), port: addr.port() };
        let r = Client::new(named).tls(Some(client_config.clone())).send(Request::get("/")).await.unwrap();
        assert_eq!((r.status, r.text()), (200, "ok".to_string()));
        let err = Client::new(addr).tls(Some(client_config)).send(Request::get("/")).await.unwrap_err();
        assert!(matches!(err, HttpError::Tls { .. }) && std::error::Error::source(&err).is_some(), "{err}");
        server.abort();
    }
}
