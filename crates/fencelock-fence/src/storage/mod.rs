//! The fenced storage server: a small HTTP object store that refuses stale
//! tokens, as a library (`fencelock storage` runs it).
//!
//! # API
//!
//! | request | fencing headers | answer |
//! |---|---|---|
//! | `PUT /objects/{key}` (body ≤ 1 MiB) | required | `201` created / `200` replaced, `{"key","token","size"}`; with `If-None-Match: *` only creates: `412` if the object exists |
//! | `DELETE /objects/{key}` | required | `200 {"key","token","existed"}` |
//! | `GET /objects/{key}` | optional: with them it is a *fenced read*, judged by the read rule (a missing object's only if its key has marks: see below) | `200` the bytes, `404 {"error":"not found","key"}` |
//! | `GET /fence/{key}` | – | `200 {"key","highest","last_write"}` (`null` if none) |
//! | `GET /log?from=SEQ&limit=N` | – | the audit log, JSON lines ([`AuditEntry`]), streamed: the entries with `seq >= from` (default 0), at most `limit` (default all), of the files still kept |
//! | `GET /healthz` | – | `200 {"status":"ok"}`, `503` after an audit log failure |
//!
//! Fencing headers: `Fencing-Lock: <lock name>` and `Fencing-Token: <decimal
//! 1..=2^63-1>`. The key's marks are judged by [the fence
//! rule](crate::Marks::admit): a `PUT` or `DELETE` is a write (admitted iff
//! its token is at or above every token admitted on the key), a fenced `GET`
//! a read (admitted iff at or above the last write's token, so the readers
//! of a read-write lock are admitted in any order). A refused token gets
//! `409 Conflict` `{"error":"stale token","rule":"stale read: token 12 <
//! last write token 15","highest":N,"got":M}` (`highest`: the mark that
//! refused it) and changes nothing (it is logged as stale). Bad requests get a `4xx` with `{"error": "..."}` and
//! change nothing, are not logged: a missing or malformed header, token `0`,
//! only one of the two headers (`400`); an invalid key (`400`: keys are 1–200
//! bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`); a body over the
//! limit (`413`); a token that could not have been issued (`400`
//! `{"error","limit"}`, or `503` if the lock service cannot be asked: see
//! [`Config::max_token`] and [`Config::lock_server`]).
//!
//! # Reads of missing objects
//!
//! A fenced read of an object that does not exist and whose key has no mark
//! answers `404` and changes nothing: it creates no mark and writes no audit
//! entry, so reading many missing keys costs no disk and poisons no future
//! key. (A missing object whose key has a mark, e.g. a deleted one, is
//! fenced as before: its marks are judged and raised, so marks only grow in
//! number by writes.) The fencing rule for reads, "a stale writer cannot write after
//! a newer holder read", still holds for every key the fence knows. For a
//! key it does not know, the newer holder read *nothing*, and its write is
//! a creation: it must say so with `If-None-Match: *`, which fails (`412`)
//! if anyone, a stale writer included, created the object after the read.
//! Then holder 6 reads `doc` (404, no mark), stale holder 5 creates `doc`
//! (admitted: the key had no mark), holder 6's create gets `412` and it
//! reads again (raising the mark to 6, so holder 5 is now refused), and
//! holder 5's acknowledged write is not lost. A creation without
//! `If-None-Match: *` after reading "missing" would overwrite it, as any
//! blind write does.
//!
//! # The audit log
//!
//! Accepted operations are fsynced before the answer; rejected (stale)
//! ones are buffered and fsynced within [`AUDIT_FLUSH_INTERVAL`] (or with the
//! next accepted one), so a flood of stale requests costs no fsync each.
//! The log is rotated by size ([`AuditConfig`]: 64 MiB files, 4 kept by
//! default). An operator's [`reset_mark`] is logged as op `RESET`.
//!
//! # The fence key is the object key
//!
//! The mark is kept per object key, not per (lock, key): whatever lock
//! protects an object must be the one lock for it, and its tokens are
//! compared with one another. `Fencing-Lock` is recorded in the audit log so
//! a checker can see which lock each token came from; tokens of two
//! different locks on one object are compared as if from one lock, which is
//! meaningless, so do not do that.
//!
//! # Order of effects, and crashes between them
//!
//! Each fenced request holds its key's lock across four steps, so requests on
//! one key take effect in the order they were admitted:
//!
//! 1. check and raise the fence mark, durably ([`crate::FileFence`]);
//! 2. write (or delete, or read) the object, durably (temporary file, fsync,
//!    rename, fsync the directory);
//! 3. append the audit entry, durably;
//! 4. answer `2xx`.
//!
//! A crash after 1 leaves the mark raised and the object unchanged: the same
//! as a fenced read. The client got no answer; its retry with the same token
//! is admitted (equal tokens are), and a lower token stays refused. A crash
//! after 2 leaves the object written with no audit entry: the client got no
//! answer, so the write is *unknown*, not acknowledged; a checker must allow
//! the object to hold such a write. A crash after 3 leaves a logged write that
//! the client never heard about: also unknown to the client. In no case is a
//! stale write admitted, and every acknowledged write is in the object store
//! and the log. The mark is raised first because the reverse order (write,
//! then raise) would let a crash leave a write on disk that the fence had not
//! accounted for.
//!
//! After an audit-log write fails the server fails closed: fenced requests
//! and `/healthz` answer `503` until it is restarted.
//!
//! # Reporting refused writes
//!
//! With [`Config::reporter`], each stale `PUT` or `DELETE` it refuses is
//! also reported to the lock service (the lock of `Fencing-Lock`, the
//! refused token, the mark that refused it, the object key as the resource),
//! from the reporter's queue: the answer `409` never waits for it, and a
//! report that cannot be sent is dropped, never the request's failure. Stale
//! fenced reads are refused as before and not reported (the lock service
//! shows them as `write_refused`, which they are not).
//!
//! # Connections, TLS, exposure
//!
//! HTTP/1.1, over TLS with [`Config::tls`] (ALPN `http/1.1`; client
//! certificates optional or required; the files re-read when they change:
//! see [`TlsFiles`]). A TLS handshake must be done within
//! [`Config::handshake_timeout`], and a request's headers must be in within
//! [`Config::header_read_timeout`], which also closes a connection that
//! never speaks or stays idle between requests. Without TLS the server
//! refuses to listen on an address other than loopback unless
//! [`Config::insecure`] says that is meant.

mod audit;
mod http;
mod listen;
mod log_stream;
mod objects;
mod tls;
mod tokens;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

pub use audit::{
    AuditConfig, AuditEntry, Outcome, AUDIT_FLUSH_INTERVAL, DEFAULT_AUDIT_KEEP_FILES, DEFAULT_AUDIT_MAX_FILE_BYTES,
};
pub use http::{LOCK_HEADER, TOKEN_HEADER};
pub use objects::{invalid_object_key, MAX_OBJECT_KEY_LEN};
pub use tls::{TlsError, TlsFiles, RELOAD_EVERY};
pub use tokens::{DEFAULT_MAX_TOKEN, DEFAULT_TOKEN_MARGIN};
/// The rustls of [`Config::lock_server_tls`].
pub use tokio_rustls::rustls;

use crate::keylocks::KeyLocks;
use crate::{FenceError, FileFence};

/// The default body limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The default [`Config::handshake_timeout`]: 10 s (the node's).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`Config::header_read_timeout`]: 10 s (the node's).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The storage server's settings.
#[derive(Clone)]
pub struct Config {
    /// Where the fence (`fence/`), the objects (`objects/`) and the audit log
    /// (`audit.log`, rotated to `audit.log.1` …) live.
    pub data_dir: PathBuf,
    /// The largest request body accepted, in bytes.
    pub max_body: usize,
    /// Reject stale tokens. `false` only to demonstrate what goes wrong without
    /// fencing: stale writes are then carried out and logged as `unfenced`.
    pub enforce: bool,
    /// The largest token accepted (default [`DEFAULT_MAX_TOKEN`]).
    pub max_token: u64,
    /// The lock service's admin HTTP (`http://host:port`, or
    /// `https://host:port` with [`Config::lock_server_tls`]): tokens above
    /// the highest it has issued plus [`Config::token_margin`] are refused.
    pub lock_server: Option<String>,
    /// TLS towards an `https://` [`Config::lock_server`]: the CA of its
    /// certificate, and a client certificate if it asks for one. The host
    /// of the URL must be named by the certificate.
    pub lock_server_tls: Option<Arc<rustls::ClientConfig>>,
    /// A bearer token sent to [`Config::lock_server`]
    /// (`Authorization: Bearer …`), for a lock service whose auth file
    /// protects `/metrics`. Never logged.
    pub lock_server_token: Option<String>,
    /// See [`Config::lock_server`] (default [`DEFAULT_TOKEN_MARGIN`]).
    pub token_margin: u64,
    /// Rotation of the audit log.
    pub audit: AuditConfig,
    /// TLS on the listener; `None` serves plaintext, which only a loopback
    /// address or [`Config::insecure`] allows.
    pub tls: Option<TlsFiles>,
    /// Serve plaintext on an address other hosts can reach all the same.
    pub insecure: bool,
    /// A TLS handshake not done within this after the accept closes the
    /// connection (default [`DEFAULT_HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// A request whose headers are not in within this (counted from the
    /// connection's start, or from the end of its previous request) closes
    /// the connection (default [`DEFAULT_HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: Duration,
    /// Where each refused stale write is reported (see "Reporting refused
    /// writes" above); `None` (the default) reports nothing.
    pub reporter: Option<crate::report::Reporter>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("data_dir", &self.data_dir)
            .field("max_body", &self.max_body)
            .field("enforce", &self.enforce)
            .field("max_token", &self.max_token)
            .field("lock_server", &self.lock_server)
            .field("lock_server_tls", &self.lock_server_tls.is_some())
            .field("lock_server_token", &self.lock_server_token.as_ref().map(|_| "***"))
            .field("token_margin", &self.token_margin)
            .field("audit", &self.audit)
            .field("tls", &self.tls)
            .field("insecure", &self.insecure)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("reporter", &self.reporter.is_some())
            .finish()
    }
}

impl Config {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            max_body: DEFAULT_MAX_BODY,
            enforce: true,
            max_token: DEFAULT_MAX_TOKEN,
            lock_server: None,
            lock_server_tls: None,
            lock_server_token: None,
            token_margin: DEFAULT_TOKEN_MARGIN,
            audit: AuditConfig::default(),
            tls: None,
            insecure: false,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            reporter: None,
        }
    }

    /// Refuses plaintext on `listen` if other hosts can reach it (an
    /// address other than loopback), unless [`Config::insecure`]; says why
    /// and the way out, in one line.
    pub fn check_exposure(&self, listen: SocketAddr) -> Result<(), String> {
        if self.insecure || self.tls.is_some() || listen.ip().is_loopback() {
            return Ok(());
        }
        Err(format!(
            "--listen {listen} is reachable from other hosts and TLS is off: anyone there could \
             read and overwrite objects and see the fencing tokens in flight. Set --tls-cert and \
             --tls-key (fencelock certs init makes them), or pass --insecure if the network is \
             yours alone"
        ))
    }
}

/// Serve the storage API on `listener`, with data in `data_dir`, until
/// `shutdown` completes (then in-flight requests finish). The caller binds
/// the listener, so tests and the CLI choose the address.
pub async fn serve(
    listener: tokio::net::TcpListener,
    data_dir: PathBuf,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, Config::new(data_dir), shutdown).await
}

/// [`serve`] with explicit settings. Fails at once (`InvalidInput`, nothing
/// written) if the listener is exposed without TLS (see
/// [`Config::check_exposure`]) or a TLS file does not load (the error names
/// the file: [`TlsError`]).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let addr = listener.local_addr()?;
    config.check_exposure(addr).map_err(invalid)?;
    let tls = match &config.tls {
        Some(files) => Some(tls::ServerTls::load(files.clone()).map_err(|e| invalid(e.to_string()))?),
        None => None,
    };
    let how = listen::Listening {
        tls: tls.clone(),
        handshake_timeout: config.handshake_timeout,
        header_read_timeout: config.header_read_timeout,
    };
    let store = Arc::new(open_store(config).await?);
    tracing::info!(%addr, tls = tls.is_some(), "fenced storage server listening");
    let flusher = tokio::spawn(flush_audit_log(store.clone()));
    let watcher = tls.map(|t| tokio::spawn(t.watch()));
    listen::serve(listener, http::router(store.clone()), how, shutdown).await;
    flusher.abort();
    if let Some(w) = watcher {
        w.abort();
    }
    tokio::task::spawn_blocking(move || store.audit.flush()).await.map_err(io::Error::other)?
}

/// Make buffered audit entries durable every [`AUDIT_FLUSH_INTERVAL`].
async fn flush_audit_log(store: Arc<http::Store>) {
    let mut ticks = tokio::time::interval(AUDIT_FLUSH_INTERVAL);
    loop {
        ticks.tick().await;
        let audit_store = store.clone();
        match tokio::task::spawn_blocking(move || audit_store.audit.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return http::audit_failed(&store, &e),
            Err(e) => tracing::error!(error = %e, "audit flush task failed"),
        }
    }
}

async fn open_store(config: Config) -> io::Result<http::Store> {
    let lock_server = match &config.lock_server {
        None => None,
        Some(url) => Some(tokens::LockServer {
            url,
            tls: config.lock_server_tls.clone(),
            token: config.lock_server_token.as_deref(),
        }),
    };
    let tokens = tokens::TokenLimit::new(config.max_token, lock_server, config.token_margin)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let dir = config.data_dir;
    std::fs::create_dir_all(&dir)?;
    let fence = FileFence::open(dir.join("fence")).await.map_err(io::Error::other)?;
    let audit_config = config.audit;
    let (objects, audit) = tokio::task::spawn_blocking(move || {
        Ok::<_, io::Error>((
            objects::ObjectStore::open(dir.join("objects"))?,
            audit::AuditLog::open(dir.join("audit.log"), audit_config)?,
        ))
    })
    .await
    .map_err(io::Error::other)??;
    Ok(http::Store {
        fence,
        objects,
        audit,
        tokens,
        locks: KeyLocks::default(),
        max_body: config.max_body,
        failed: AtomicBool::new(false),
        enforce: config.enforce,
        reporter: config.reporter,
    })
}

/// Why [`reset_mark`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetMarkError {
    /// The key is not a valid object key.
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey {
        /// The key given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The fence could not be opened (a running storage server holds it:
    /// stop it first) or rewritten.
    #[error("cannot open or rewrite the fence in {} (is the storage server stopped?)", dir.display())]
    Fence {
        /// The fence directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: FenceError,
    },
    /// The audit entry could not be written; the mark was not changed.
    #[error("cannot write the audit log in {}; the mark was not changed", dir.display())]
    Audit {
        /// The data directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// What [`reset_mark`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkReset {
    /// The mark before (`None`: there was none).
    pub before: Option<u64>,
    /// The mark after (`None`: removed).
    pub after: Option<u64>,
}

/// Reset the mark of `key` in the storage server's `data_dir` to `to`
/// (`None` removes it, so any token is admitted next): an operator's
/// repair of a key poisoned by an absurd token. The server must be stopped
/// (the fence directory's lock refuses a second user). The audit log gets a
/// `RESET` entry, fsynced, before the mark changes.
///
/// Lowering a mark re-admits tokens it refused, stale holders' included: set
/// it to at least the highest token the lock service has issued for the
/// lock that guards `key` (`fencelock_token_counter` on its `/metrics`).
pub fn reset_mark(data_dir: &Path, key: &str, to: Option<u64>) -> Result<MarkReset, ResetMarkError> {
    if let Some(reason) = invalid_object_key(key) {
        return Err(ResetMarkError::InvalidKey { key: key.to_owned(), reason });
    }
    let fence_dir = data_dir.join("fence");
    let fence_err = |source| ResetMarkError::Fence { dir: fence_dir.clone(), source };
    if let Some(token) = to {
        crate::check_token(token).map_err(fence_err)?;
    }
    let fence = FileFence::open_blocking(fence_dir.clone()).map_err(fence_err)?;
    let before = fence.highest_blocking(key).map_err(fence_err)?;
    // No rotation here: the server's limits are not known to this tool, and
    // one line does not matter.
    let no_rotation = AuditConfig { max_file_bytes: u64::MAX, keep_files: DEFAULT_AUDIT_KEEP_FILES };
    let audit_err = |source| ResetMarkError::Audit { dir: data_dir.to_owned(), source };
    let audit = audit::AuditLog::open(data_dir.join("audit.log"), no_rotation).map_err(audit_err)?;
    let record = audit::Record {
        op: "RESET",
        key: key.to_owned(),
        lock: String::new(),
        token: before.unwrap_or(0),
        outcome: Outcome::Accepted,
        highest: to.unwrap_or(0),
    };
    audit.append(record, audit::Durability::Sync).map_err(audit_err)?;
    fence.reset_mark(key, to).map_err(fence_err)?;
    tracing::warn!(key, ?before, after = ?to, "fence mark reset by the operator");
    Ok(MarkReset { before, after: to })
}
