//! The fenced storage server: a small HTTP object store that refuses stale
//! tokens, as a library (`fencelock storage` runs it).
//!
//! # API
//!
//! | request | fencing headers | answer |
//! |---|---|---|
//! | `PUT /objects/{key}` (body ≤ 1 MiB) | required | `201` created / `200` replaced, `{"key","token","size"}` |
//! | `DELETE /objects/{key}` | required | `200 {"key","token","existed"}` |
//! | `GET /objects/{key}` | optional: with them it is a *fenced read* and raises the mark like a write (also when the object is missing) | `200` the bytes, `404 {"error":"not found","key"}` |
//! | `GET /fence/{key}` | – | `200 {"key","highest"}` (`null` if never fenced) |
//! | `GET /log` | – | the audit log, JSON lines ([`AuditEntry`]) |
//! | `GET /healthz` | – | `200 {"status":"ok"}`, `503` after an audit log failure |
//!
//! Fencing headers: `Fencing-Lock: <lock name>` and `Fencing-Token: <decimal
//! 1..=2^63-1>`. A token below the key's mark gets `409 Conflict`
//! `{"error":"stale token","highest":N,"got":M}` and changes nothing (it is
//! logged as stale). Bad requests get a `4xx` with `{"error": "..."}` and
//! change nothing, are not logged: a missing or malformed header, token `0`,
//! only one of the two headers (`400`); an invalid key (`400`: keys are 1–200
//! bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`); a body over the
//! limit (`413`).
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

mod audit;
mod http;
mod objects;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use audit::{AuditEntry, Outcome};
pub use http::{LOCK_HEADER, TOKEN_HEADER};
pub use objects::{invalid_object_key, MAX_OBJECT_KEY_LEN};

use crate::keylocks::KeyLocks;
use crate::FileFence;

/// The default body limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The storage server's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the fence (`fence/`), the objects (`objects/`) and the audit log
    /// (`audit.log`) live.
    pub data_dir: PathBuf,
    /// The largest request body accepted, in bytes.
    pub max_body: usize,
    /// Reject stale tokens. `false` only to demonstrate what goes wrong without
    /// fencing: stale writes are then carried out and logged as `unfenced`.
    pub enforce: bool,
}

impl Config {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            max_body: DEFAULT_MAX_BODY,
            enforce: true,
        }
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

/// [`serve`] with explicit settings.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let store = Arc::new(open_store(config).await?);
    tracing::info!(addr = ?listener.local_addr().ok(), "fenced storage server listening");
    axum::serve(listener, http::router(store))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn open_store(config: Config) -> io::Result<http::Store> {
    let dir = config.data_dir;
    std::fs::create_dir_all(&dir)?;
    let fence = FileFence::open(dir.join("fence"))
        .await
        .map_err(io::Error::other)?;
    let (objects, audit) = tokio::task::spawn_blocking(move || {
        Ok::<_, io::Error>((
            objects::ObjectStore::open(dir.join("objects"))?,
            audit::AuditLog::open(dir.join("audit.log"))?,
        ))
    })
    .await
    .map_err(io::Error::other)??;
    Ok(http::Store {
        fence,
        objects,
        audit,
        locks: KeyLocks::default(),
        max_body: config.max_body,
        failed: AtomicBool::new(false),
        enforce: config.enforce,
    })
}
