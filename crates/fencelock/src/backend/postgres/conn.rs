//! Connections to PostgreSQL: opening one (the handshake bounded by the
//! `connect_timeout`) with the task that drives it, the probe made at
//! connect, and how a driver error becomes an [`Error`] (the
//! `tokio_postgres::Error` kept as its source).
//!
//! Where it sits: under [`super::PgBackend`]; both modes and the listening
//! connection open theirs through [`open`].

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::Client;

use super::tls::PgConfig;
use super::CONNECT_TIMEOUT;
use crate::error::Error;

/// A connection that could not be opened: what to say, and the driver's error
/// where there was one (none when the handshake did not finish in time).
#[derive(Debug)]
pub(super) struct OpenFailed {
    text: String,
    source: Option<tokio_postgres::Error>,
}

impl OpenFailed {
    /// The driver refused or failed the connection: `e` is the source, and
    /// its text stays there (not in the message).
    pub(super) fn by(e: tokio_postgres::Error) -> OpenFailed {
        OpenFailed { text: "the connection failed".into(), source: Some(e) }
    }

    /// No answer (`what`: " to LISTEN", or "" for the handshake) within `limit`.
    pub(super) fn no_answer(what: &str, limit: Duration) -> OpenFailed {
        OpenFailed { text: format!("no answer{what} within {} ms", limit.as_millis()), source: None }
    }

    /// As [`Error::Connect`] (at connect time), `context` saying which connection.
    pub(super) fn connect(self, context: &str) -> Error {
        let message = format!("postgres: {context}{}", self.text);
        match self.source {
            Some(e) => Error::connect_caused(message, e),
            None => Error::connect(message),
        }
    }

    /// As [`Error::Backend`] (a connection opened later, for an operation).
    pub(super) fn backend(self) -> Error {
        self.backend_while("")
    }

    /// As [`Error::Backend`], `context` saying what the connection was for.
    pub(super) fn backend_while(self, context: &str) -> Error {
        let message = format!("{context}{}", self.text);
        match self.source {
            Some(e) => Error::backend_caused("postgres", message, e),
            None => Error::backend("postgres", message),
        }
    }
}

impl std::fmt::Display for OpenFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Opens one connection (the whole handshake bounded by the config's
/// `connect_timeout`) and spawns the task that drives it.
pub(super) async fn open(config: &PgConfig) -> Result<(Client, JoinHandle<()>), OpenFailed> {
    let limit = config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
    let (client, connection) = match tokio::time::timeout(limit, config.connect()).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Err(OpenFailed::by(e)),
        Err(_) => return Err(OpenFailed::no_answer("", limit)),
    };
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe(&e), "fencelock: postgres connection ended");
        }
    });
    Ok((client, driver))
}

/// Opens and closes one connection, so that a refused password or a failed
/// TLS handshake at connect is an [`Error::Security`] that says so, and any
/// other failure an [`Error::Connect`].
pub(super) async fn probe(config: &PgConfig) -> Result<(), Error> {
    let limit = config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
    match tokio::time::timeout(limit, config.connect()).await {
        Ok(Ok(_closed_on_drop)) => Ok(()),
        Ok(Err(e)) => Err(connect_error(e)),
        Err(_) => Err(Error::connect(format!("postgres: no answer within {} ms", limit.as_millis()))),
    }
}

/// A failed connection attempt as [`Error::Security`] (authentication
/// refused, no `pg_hba.conf` entry for this user or encryption, a failed TLS
/// handshake) or [`Error::Connect`].
fn connect_error(e: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    if let Some(db) = e.as_db_error() {
        let refused = [SqlState::INVALID_PASSWORD, SqlState::INVALID_AUTHORIZATION_SPECIFICATION];
        if refused.contains(db.code()) {
            return Error::security(format!("postgres: authentication refused: {}", db.message()), db.clone());
        }
    }
    if let Some(cause) = crate::backend::tls::rustls_cause(&e) {
        return Error::security(format!("postgres: TLS handshake failed: {cause}"), cause.clone());
    }
    let text = describe(&e);
    if text.contains("TLS") {
        return Error::security(format!("postgres: {text}"), e);
    }
    Error::connect_caused("postgres: the connection failed", e)
}

/// A tokio-postgres error with the server's message, if it sent one.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// [`Error::Backend`] for a failed `what`, caused by the driver's `e` (its
/// text, and the server's message, are in the source chain).
pub(super) fn backend_error(what: &str, e: tokio_postgres::Error) -> Error {
    Error::backend_caused("postgres", what, e)
}

/// Runs `f` until `by`: [`Error::Backend`] if it has not finished by then (the
/// statement may still run on the server: callers that could leave a grant
/// behind clean up by owner).
pub(super) async fn bounded<T>(
    what: &str,
    by: Instant,
    f: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout_at(by, f).await {
        Ok(result) => result.map_err(|e| backend_error(what, e)),
        Err(_) => Err(Error::backend("postgres", format!("{what}: no answer in time"))),
    }
}

/// Spawns `f` on the current runtime, if there is one (a guard dropped outside
/// any runtime leaves its lock to expire instead).
pub(super) fn spawn_detached(f: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(f);
    }
}

/// A task that is aborted when this handle is dropped.
#[derive(Debug)]
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
