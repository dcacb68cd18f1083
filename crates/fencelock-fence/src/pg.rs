//! [`PgFence`]: the fence as a row in PostgreSQL, checked and raised inside
//! the caller's own transaction, so a stale writer's transaction changes
//! nothing.
//!
//! The table, one row per resource key:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fencelock_fence (
//!     key   text   PRIMARY KEY,
//!     token bigint NOT NULL CHECK (token > 0)
//! );
//! ```
//!
//! The check, the first statement of the writer's transaction:
//!
//! ```sql
//! INSERT INTO fencelock_fence (key, token) VALUES ($1, $2)
//! ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token
//!     WHERE fencelock_fence.token <= EXCLUDED.token
//! RETURNING token;
//! ```
//!
//! One row back: admitted, and the fence row stays locked until the
//! transaction ends, so every other fenced transaction on the key waits for
//! this one. No row: stale; roll back. The comparison runs on the row *after*
//! it is locked (`ON CONFLICT DO UPDATE` locks the conflicting row, then
//! evaluates its `WHERE` on the latest committed version under READ
//! COMMITTED), so two writers cannot both pass against an old value. Under
//! REPEATABLE READ or SERIALIZABLE a concurrent raise makes the statement
//! fail with a serialization error instead; retry the transaction.
//!
//! The crate's README has the same SQL for services not written in Rust.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use tokio_postgres::{Client, GenericClient, NoTls, Transaction};

use crate::fence::{check_input, check_key, Fence, FenceError, Fenced, Stale};

/// The fence table's DDL (idempotent).
pub const CREATE_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS fencelock_fence (\
     key text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))";

/// The check-and-raise statement: `$1` key (text), `$2` token (bigint).
/// Returns one row if admitted, none if stale.
pub const ADMIT_SQL: &str = "INSERT INTO fencelock_fence (key, token) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token \
     WHERE fencelock_fence.token <= EXCLUDED.token RETURNING token";

/// The mark of a key: `$1` key. No row: never admitted.
pub const HIGHEST_SQL: &str = "SELECT token FROM fencelock_fence WHERE key = $1";

/// A future borrowing the transaction, as [`PgFence::run`]'s closure returns.
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Why [`PgFence::run`] did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E> {
    /// The fence check or the commit failed; see [`FenceError`]. If the
    /// commit itself failed (connection lost), the transaction may or may not
    /// have committed.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// The caller's closure failed; the transaction was rolled back, the
    /// mark raise with it.
    #[error("fenced transaction failed: {0}")]
    Caller(#[source] E),
}

/// A [`Fence`] backed by the `fencelock_fence` table.
///
/// As a plain [`Fence`] each `admit` is its own transaction (the statement in
/// autocommit). To fence your own SQL use [`PgFence::run`], which puts the
/// check and your statements in one transaction.
pub struct PgFence {
    client: Client,
}

impl PgFence {
    /// Use `client` (its connection task already spawned). Call
    /// [`PgFence::create_table`] once before first use.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Connect without TLS (`host=… port=… user=… dbname=…`), spawn the
    /// connection task, and create the table if missing.
    pub async fn connect(config: &str) -> Result<Self, FenceError> {
        let (client, connection) = tokio_postgres::connect(config, NoTls).await.map_err(FenceError::storage)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "fencelock PgFence connection closed");
            }
        });
        Self::create_table(&client).await?;
        Ok(Self::new(client))
    }

    /// Create the fence table if it does not exist.
    pub async fn create_table(client: &impl GenericClient) -> Result<(), FenceError> {
        client.batch_execute(CREATE_TABLE_SQL).await.map_err(FenceError::storage)
    }

    /// The client this fence uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Run `body` in a transaction fenced by (`key`, `token`): the check is
    /// the first statement; if the token is stale the transaction is rolled
    /// back, `body` never runs, and the outcome is [`Fenced::Stale`].
    /// Otherwise `body` runs in the same transaction, with the fence row
    /// locked, and the transaction commits if `body` returns `Ok`.
    ///
    /// Use it for fenced reads too: a read-only `body` still raises the mark,
    /// so a lower token can no longer write what this one read.
    ///
    /// ```no_run
    /// # use fencelock_fence::{PgFence, Fenced};
    /// # async fn f(client: &mut tokio_postgres::Client, token: u64) -> Result<(), Box<dyn std::error::Error>> {
    /// let outcome = PgFence::run(client, "account:42", token, |tx| Box::pin(async move {
    ///     tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 42", &[]).await
    /// })).await?;
    /// if let Fenced::Stale(stale) = outcome {
    ///     eprintln!("lost the lock: {stale}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F>(client: &mut Client, key: &str, token: u64, body: F) -> Result<Fenced<T>, RunError<E>>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T, E>,
    {
        check_input(key, token)?;
        let tx = client.transaction().await.map_err(FenceError::storage)?;
        if let Fenced::Stale(stale) = admit_in(&tx, key, token).await? {
            tx.rollback().await.map_err(FenceError::storage)?;
            return Ok(Fenced::Stale(stale));
        }
        let value = match body(&tx).await {
            Ok(value) => value,
            Err(e) => {
                // Rolled back on drop if this fails; the caller's error matters more.
                let _ = tx.rollback().await;
                return Err(RunError::Caller(e));
            }
        };
        tx.commit().await.map_err(FenceError::storage)?;
        Ok(Fenced::Admitted(value))
    }
}

/// The check inside any transaction (or autocommit): admit, or find the mark
/// that made the token stale.
async fn admit_in(client: &impl GenericClient, key: &str, token: u64) -> Result<Fenced, FenceError> {
    let rows = client.query(ADMIT_SQL, &[&key, &(token as i64)]).await.map_err(FenceError::storage)?;
    if !rows.is_empty() {
        return Ok(Fenced::Admitted(()));
    }
    // Stale: the row exists and is locked by us (or was raised since); its
    // token is above ours.
    let highest = mark_of(client, key).await?.ok_or_else(|| FenceError::Corrupt("stale without a fence row".into()))?;
    Ok(Fenced::Stale(Stale { highest, got: token }))
}

async fn mark_of(client: &impl GenericClient, key: &str) -> Result<Option<u64>, FenceError> {
    let row = client.query_opt(HIGHEST_SQL, &[&key]).await.map_err(FenceError::storage)?;
    Ok(row.map(|r| r.get::<_, i64>(0) as u64))
}

#[async_trait]
impl Fence for PgFence {
    async fn admit(&self, key: &str, token: u64) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        admit_in(&self.client, key, token).await
    }

    async fn highest(&self, key: &str) -> Result<Option<u64>, FenceError> {
        check_key(key)?;
        mark_of(&self.client, key).await
    }
}
