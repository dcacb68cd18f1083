//! The connection to one Redis server (shared with Redlock's nodes): one
//! multiplexed connection made on first use and made again after it breaks,
//! every call bounded by a deadline and resent once on a fresh connection
//! when it is idempotent ([`Retry`]); a driver error mapped to [`Error`] with
//! the driver's error as its source; and the `durable=true` check made once
//! at connect.
//!
//! Where it sits: under [`super::RedisBackend`]; [`super::super::redlock`]
//! keeps one [`Conn`] per node.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, RedisResult, TlsCertificates,
};
use tokio::time::{timeout_at, Instant};

use super::params::db_number;
use crate::backend::tls::{self, TlsFiles};
use crate::backend::BackendUrl;
use crate::error::Error;

/// How long connecting to a server may take (the connection attempt only).
pub(in crate::backend) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request (a script, a command) may take, outside renewals
/// (which the watchdog bounds).
pub(in crate::backend) const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses durable mode unless the server fsyncs its AOF on every write.
pub(super) async fn check_durable(conn: &Conn) -> Result<(), Error> {
    let refuse = |why: String| {
        Error::Unsupported(format!(
            "redis: durable=true needs the server {} to run with `appendonly yes` and `appendfsync always` \
             (set them in redis.conf or with CONFIG SET), {why}; or drop durable=true and accept that tokens \
             can go backwards after a restart",
            conn.addr
        ))
    };
    let appendonly = config_get(conn, "appendonly").await.map_err(|e| refuse(format!("and CONFIG GET failed: {e}")))?;
    let appendfsync =
        config_get(conn, "appendfsync").await.map_err(|e| refuse(format!("and CONFIG GET failed: {e}")))?;
    if appendonly == "yes" && appendfsync == "always" {
        Ok(())
    } else {
        Err(refuse(format!("but it has appendonly={appendonly} and appendfsync={appendfsync}")))
    }
}

/// `CONFIG GET param`: its value.
async fn config_get(conn: &Conn, param: &str) -> Result<String, Error> {
    let deadline = crate::clock::now() + OP_TIMEOUT;
    let pair: Vec<String> = conn
        .run(deadline, Retry::Once, |mut c| async move {
            redis::cmd("CONFIG").arg("GET").arg(param).query_async(&mut c).await
        })
        .await?;
    match pair.as_slice() {
        [_, value] => Ok(value.clone()),
        _ => Err(Error::backend("redis", format!("CONFIG GET {param} answered {pair:?}"))),
    }
}

/// Whether a call may be sent again on a fresh connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend) enum Retry {
    /// Idempotent: once more if the connection turned out broken (e.g. the
    /// server restarted since the connection was made).
    Once,
    /// The answer matters and a second run could give another one.
    Never,
}

/// One Redis server over one multiplexed connection, made on first use and
/// made again after it breaks (an IO error or a call without an answer by its
/// deadline). Every call is bounded by a deadline.
pub(in crate::backend) struct Conn {
    pub(super) client: redis::Client,
    /// `host:port`, for messages.
    pub(in crate::backend) addr: String,
    /// Whether the connection is TLS.
    tls: bool,
    /// The connection in use with its generation (from 1), if any.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so that concurrent callers wait for one connection.
    connecting: tokio::sync::Mutex<()>,
    generations: AtomicU64,
}

impl Conn {
    /// A handle on the server `host:port` with the URL's credentials,
    /// database and TLS files (`tls`, read once by the caller: see
    /// [`crate::backend::tls`]); does not connect yet.
    pub(in crate::backend) fn new(
        url: &BackendUrl,
        host: &str,
        port: u16,
        tls: Option<&TlsFiles>,
    ) -> Result<Conn, Error> {
        let mut redis = RedisConnectionInfo::default().set_db(i64::from(db_number(url)?));
        if let Some(user) = url.user() {
            redis = redis.set_username(user);
        }
        if let Some(password) = url.password() {
            redis = redis.set_password(password);
        }
        let addr = match tls {
            None => ConnectionAddr::Tcp(host.to_string(), port),
            Some(_) => ConnectionAddr::TcpTls { host: host.to_string(), port, insecure: false, tls_params: None },
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::InvalidArgument(format!("{url}: {e}")))?
            .set_redis_settings(redis);
        let client = match tls {
            None => redis::Client::open(info),
            Some(files) => redis::Client::build_with_tls(info, certificates(files)),
        }
        .map_err(|e| Error::InvalidArgument(format!("{url}: {e}")))?;
        let shown = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        Ok(Conn {
            client,
            addr: format!("{shown}:{port}"),
            tls: tls.is_some(),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
        })
    }

    /// Connects and pings: [`Error::Connect`] if that fails within
    /// [`CONNECT_TIMEOUT`], [`Error::Security`] if the TLS handshake or the
    /// authentication fails.
    pub(in crate::backend) async fn connect_now(&self) -> Result<(), Error> {
        let deadline = crate::clock::now() + CONNECT_TIMEOUT;
        self.run(deadline, Retry::Never, |mut c| async move { redis::cmd("PING").query_async::<()>(&mut c).await })
            .await
            .map_err(|e| {
                let hint = " (a server that closes plaintext connections may speak TLS only: use rediss://)";
                e.while_connecting(if self.tls { "" } else { hint })
            })
    }

    /// A new connection of its own (not the shared one), for a blocking command.
    pub(in crate::backend) async fn open(&self) -> Result<MultiplexedConnection, Error> {
        let config = connection_config();
        let connect = self.client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => Err(Error::backend("redis", format!("{}: no connection within {CONNECT_TIMEOUT:?}", self.addr))),
        }
    }

    /// Runs `op` on the shared connection by `deadline`. A broken connection
    /// is dropped (the next call makes a new one); with [`Retry::Once`], a
    /// call that found the connection broken runs once more on a new one.
    pub(in crate::backend) async fn run<T, F, Fut>(&self, deadline: Instant, retry: Retry, op: F) -> Result<T, Error>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let used = AtomicU64::new(0);
        let call = async {
            let mut retried = false;
            loop {
                let (generation, conn, fresh) = self.get().await?;
                used.store(generation, Ordering::Relaxed);
                match op(conn).await {
                    Err(e) if breaks(&e) => {
                        self.forget(generation);
                        if retry == Retry::Never || fresh || retried {
                            return Err(e);
                        }
                        retried = true;
                    }
                    other => return other,
                }
            }
        };
        match timeout_at(deadline, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => {
                // A connection that leaves a call unanswered may be dead
                // without an error (a partition): make a new one next time.
                self.forget(used.load(Ordering::Relaxed));
                Err(Error::backend("redis", format!("{}: no answer in time", self.addr)))
            }
        }
    }

    /// The shared connection (and whether it was made by this call).
    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection, bool)> {
        if let Some((generation, conn)) = self.current() {
            return Ok((generation, conn, false));
        }
        let _connecting = self.connecting.lock().await;
        if let Some((generation, conn)) = self.current() {
            return Ok((generation, conn, true));
        }
        let conn = self.client.get_multiplexed_async_connection_with_config(&connection_config()).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some((generation, conn.clone()));
        Ok((generation, conn, true))
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Drops connection `generation` if it is still the one in use.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// A failed call as [`Error::Backend`], or [`Error::Security`] for a
    /// failed TLS handshake or a refused authentication; either way `e` is
    /// the source, and its text is left to it.
    pub(in crate::backend) fn error(&self, e: &RedisError) -> Error {
        if let Some(cause) = tls::rustls_cause(e) {
            return Error::security(format!("redis: {}: TLS handshake failed: {cause}", self.addr), cause.clone());
        }
        // The redis crate keeps rustls's error only as text.
        let text = e.to_string();
        if self.tls
            && ["invalid peer certificate", "received fatal alert", "peer is incompatible"]
                .iter()
                .any(|t| text.contains(t))
        {
            return Error::security(format!("redis: {}: TLS handshake failed: {text}", self.addr), e.clone());
        }
        let refused = match e.code() {
            _ if e.kind() == ErrorKind::AuthenticationFailed => Some("authentication refused (wrong user or password)"),
            Some("WRONGPASS") => Some("authentication refused (wrong user or password)"),
            Some("NOAUTH") => Some("the server requires authentication: give user:password@ in the URL"),
            Some("NOPERM") => Some("the ACL user lacks a permission the backend needs (+@all on its keys)"),
            _ => None,
        };
        match refused {
            Some(why) => Error::security(format!("redis: {}: {why}", self.addr), e.clone()),
            None => Error::backend_caused("redis", self.addr.clone(), e.clone()),
        }
    }
}

/// The TLS files as the redis driver takes them.
fn certificates(files: &TlsFiles) -> TlsCertificates {
    TlsCertificates {
        client_tls: files
            .identity
            .as_ref()
            .map(|(cert, key)| ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
        root_cert: Some(files.ca_pem.clone()),
    }
}

/// No response timeout in the driver: every call has its own deadline here
/// (and a `BLPOP` must be able to block).
fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT)).set_response_timeout(None)
}

/// Does `e` mean the connection is unusable (rather than a refusal by the
/// server, over a healthy connection)?
pub(super) fn breaks(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Io | ErrorKind::Parse) || e.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::RedisBackend;

    /// Errors keep their sources: a refused connection is an
    /// `Error::Connect` whose chain holds the `redis::RedisError`, and whose
    /// message does not repeat its text.
    #[tokio::test]
    async fn a_refused_connection_keeps_the_redis_error() {
        let port = crate::backend::refused_port();
        let url = BackendUrl::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
        let err = RedisBackend::connect(&url).await.unwrap_err();
        let Error::Connect { message, .. } = &err else { panic!("{err:?}") };
        assert!(crate::error::caused_by::<RedisError>(&err), "{err:?}");
        assert!(!message.to_lowercase().contains("refused"), "the driver's text stays in the source: {message}");
    }
}
