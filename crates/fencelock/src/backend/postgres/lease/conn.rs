//! The statement connection of the lease-table mode: opened at connect,
//! reopened on the next statement after it dropped or stalled, every
//! statement bounded by a deadline; and [`Failed`], a statement's error with
//! whether repeating it may succeed.
//!
//! Where it sits: under [`super::LeaseMode`]; every statement of
//! [`super::store`], [`super::held`], `shared` and `election` runs through
//! [`Db::query`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::super::{backend_error, open, OpenFailed, STATEMENT_TIMEOUT};
use super::Config;
use crate::error::Error;

/// A connection after which one statement waited this long without an answer is
/// presumed dead (a silent peer) and is replaced.
const STALL: Duration = STATEMENT_TIMEOUT;

/// The statement connection: opened at connect, reopened on the next statement
/// after it dropped (or stalled: see [`STALL`]).
pub(super) struct Db {
    config: Config,
    current: Mutex<Option<Arc<Conn>>>,
    /// Serialises reopening, so that concurrent statements open one connection.
    opening: tokio::sync::Mutex<()>,
}

pub(super) struct Conn {
    pub(super) client: Client,
    driver: JoinHandle<()>,
}

impl Db {
    pub(super) async fn connect(config: Config) -> Result<Db, Error> {
        let conn = Conn::open(&config).await.map_err(|e| e.connect(""))?;
        Ok(Db { config, current: Mutex::new(Some(Arc::new(conn))), opening: tokio::sync::Mutex::new(()) })
    }

    fn slot(&self) -> MutexGuard<'_, Option<Arc<Conn>>> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn live(&self) -> Option<Arc<Conn>> {
        self.slot().as_ref().filter(|c| !c.client.is_closed()).cloned()
    }

    /// The open connection, reopened if needed (by `by`).
    pub(super) async fn conn(&self, by: Instant) -> Result<Arc<Conn>, Failed> {
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let no_time = || Failed::transient("reconnecting: no connection in time".into());
        let _opening = tokio::time::timeout_at(by, self.opening.lock()).await.map_err(|_| no_time())?;
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let conn = match tokio::time::timeout_at(by, Conn::open(&self.config)).await {
            Ok(Ok(conn)) => Arc::new(conn),
            Ok(Err(e)) => return Err(Failed { error: e.backend_while("reconnecting: "), transient: true }),
            Err(_) => return Err(no_time()),
        };
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Runs one statement by `by`. A statement that went unanswered for
    /// [`STALL`] retires its connection (the next statement reconnects).
    pub(super) async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        by: Instant,
    ) -> Result<Vec<Row>, Failed> {
        let conn = self.conn(by).await?;
        let sent = crate::clock::now();
        match tokio::time::timeout_at(by, conn.client.query_typed(sql, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(Failed { transient: is_transient(&e), error: backend_error(what, e) }),
            Err(_) => {
                if sent.elapsed() >= STALL {
                    self.retire(&conn);
                }
                Err(Failed::transient(format!("{what}: no answer in time")))
            }
        }
    }

    /// Drops `conn` (if still current) and stops its driver.
    fn retire(&self, conn: &Arc<Conn>) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
        conn.driver.abort();
    }
}

impl Conn {
    /// Opens a connection, with `synchronous_commit` raised to `on` if the
    /// server's default is `off` (a grant must be durable when acknowledged).
    async fn open(config: &Config) -> Result<Conn, OpenFailed> {
        let (client, driver) = open(config).await?;
        let limit = config.get_connect_timeout().copied().unwrap_or(super::super::CONNECT_TIMEOUT);
        let durable = "SELECT set_config('synchronous_commit', 'on', false) \
                       WHERE current_setting('synchronous_commit') = 'off'";
        match tokio::time::timeout(limit, client.batch_execute(durable)).await {
            Ok(Ok(())) => Ok(Conn { client, driver }),
            Ok(Err(e)) => Err(OpenFailed::by(e)),
            Err(_) => Err(OpenFailed::no_answer("", limit)),
        }
    }
}

/// A failed statement: the error, and whether repeating it may succeed (the
/// connection failed, not the statement).
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) error: Error,
    pub(super) transient: bool,
}

impl Failed {
    fn transient(message: String) -> Failed {
        Failed { error: Error::backend("postgres", message), transient: true }
    }
}

impl From<Error> for Failed {
    fn from(error: Error) -> Failed {
        Failed { error, transient: false }
    }
}

impl From<Failed> for Error {
    fn from(failed: Failed) -> Error {
        failed.error
    }
}

/// Did the connection fail rather than the statement? No answer from the
/// server at all, or an answer that says "try again": a rolled-back
/// transaction (class 40: serialization failure, deadlock), a resource limit
/// (class 53), an operator's intervention (class 57: shutdown, restart).
fn is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(code) => ["40", "53", "57"].iter().any(|class| code.code().starts_with(class)),
    }
}
