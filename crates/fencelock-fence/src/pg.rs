//! [`PgFence`]: the fence as a row in PostgreSQL, checked and raised inside
//! the caller's own transaction, so a stale writer's transaction changes
//! nothing.
//!
//! The table, one row per resource key: `token` is the highest token
//! admitted, `written` the last write's token (NULL: equal to `token`, which
//! is every row touched only by writes, and every row from before fenced
//! reads; 0: no write yet):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fencelock_fence (
//!     key     text   PRIMARY KEY,
//!     token   bigint NOT NULL CHECK (token > 0),
//!     written bigint
//! );
//! -- a table from before fenced reads, once:
//! ALTER TABLE fencelock_fence ADD COLUMN IF NOT EXISTS written bigint;
//! ```
//!
//! The check of a write, the first statement of the writer's transaction
//! (admitted iff the token is at or above every admitted token):
//!
//! ```sql
//! INSERT INTO fencelock_fence (key, token) VALUES ($1, $2)
//! ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, written = NULL
//!     WHERE fencelock_fence.token <= EXCLUDED.token
//! RETURNING token;
//! ```
//!
//! The check of a read (admitted iff the token is at or above the last
//! write's; raises `token`):
//!
//! ```sql
//! INSERT INTO fencelock_fence (key, token, written) VALUES ($1, $2, 0)
//! ON CONFLICT (key) DO UPDATE
//!     SET token = GREATEST(fencelock_fence.token, EXCLUDED.token),
//!         written = COALESCE(fencelock_fence.written, fencelock_fence.token)
//!     WHERE COALESCE(fencelock_fence.written, fencelock_fence.token) <= EXCLUDED.token
//! RETURNING token;
//! ```
//!
//! Both are [the rule](crate::Marks::admit) in SQL. One row back: admitted,
//! and the fence row stays locked until the transaction ends, so every other
//! fenced transaction on the key waits for this one (fenced reads of one key
//! run one at a time too). No row: stale; roll back. The comparison runs on
//! the row *after* it is locked (`ON CONFLICT DO UPDATE` locks the
//! conflicting row, then evaluates its `WHERE` on the latest committed
//! version under READ COMMITTED), so two writers cannot both pass against an
//! old value. Under REPEATABLE READ or SERIALIZABLE a concurrent raise makes
//! the statement fail with a serialization error instead; retry the
//! transaction.
//!
//! The crate's README has the same SQL for services not written in Rust.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use tokio_postgres::{Client, GenericClient, NoTls, Transaction};

use crate::fence::{check_input, check_key, Access, Fence, FenceError, Fenced, Marks, Stale};

/// The fence table's DDL (idempotent). It adds `written` to a table created
/// before fenced reads, taking the table's lock only then: an `ALTER TABLE`
/// on every connect would wait for, and hold up, every fenced transaction.
pub const CREATE_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS fencelock_fence (\
     key text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0), written bigint); \
     DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM information_schema.columns \
     WHERE table_schema = current_schema() AND table_name = 'fencelock_fence' AND column_name = 'written') \
     THEN ALTER TABLE fencelock_fence ADD COLUMN IF NOT EXISTS written bigint; END IF; END $$";

/// The check-and-raise statement of a write: `$1` key (text), `$2` token
/// (bigint). Returns one row if admitted, none if stale.
pub const ADMIT_SQL: &str = "INSERT INTO fencelock_fence (key, token) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, written = NULL \
     WHERE fencelock_fence.token <= EXCLUDED.token RETURNING token";

/// The check-and-raise statement of a read: `$1` key (text), `$2` token
/// (bigint). Returns one row if admitted, none if stale.
pub const ADMIT_READ_SQL: &str = "INSERT INTO fencelock_fence (key, token, written) VALUES ($1, $2, 0) \
     ON CONFLICT (key) DO UPDATE SET token = GREATEST(fencelock_fence.token, EXCLUDED.token), \
     written = COALESCE(fencelock_fence.written, fencelock_fence.token) \
     WHERE COALESCE(fencelock_fence.written, fencelock_fence.token) <= EXCLUDED.token RETURNING token";

/// The marks of a key: `$1` key; the highest token and the last write's.
/// No row: never admitted.
pub const MARKS_SQL: &str = "SELECT token, COALESCE(written, token) FROM fencelock_fence WHERE key = $1";

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
    /// This is a fenced *write*; for a read use [`PgFence::run_read`].
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
        Self::run_as(client, key, token, Access::Write, body).await
    }

    /// [`PgFence::run`] for a fenced *read*: the check is the read rule, so
    /// a reader granted before the last write is refused and readers in any
    /// token order are admitted; an admitted read raises the highest token,
    /// so an older writer can no longer write what this one read.
    pub async fn run_read<T, E, F>(
        client: &mut Client,
        key: &str,
        token: u64,
        body: F,
    ) -> Result<Fenced<T>, RunError<E>>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T, E>,
    {
        Self::run_as(client, key, token, Access::Read, body).await
    }

    async fn run_as<T, E, F>(
        client: &mut Client,
        key: &str,
        token: u64,
        access: Access,
        body: F,
    ) -> Result<Fenced<T>, RunError<E>>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T, E>,
    {
        check_input(key, token)?;
        let tx = client.transaction().await.map_err(FenceError::storage)?;
        if let Fenced::Stale(stale) = admit_in(&tx, key, token, access).await? {
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
async fn admit_in(client: &impl GenericClient, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
    let sql = match access {
        Access::Read => ADMIT_READ_SQL,
        Access::Write => ADMIT_SQL,
    };
    let rows = client.query(sql, &[&key, &(token as i64)]).await.map_err(FenceError::storage)?;
    if !rows.is_empty() {
        return Ok(Fenced::Admitted(()));
    }
    // Stale: the row exists and is locked by us (or was raised since); the
    // mark the rule holds this access against is above the token.
    let marks = marks_of(client, key).await?.ok_or_else(|| FenceError::Corrupt("stale without a fence row".into()))?;
    let highest = match access {
        Access::Read => marks.write,
        Access::Write => marks.seen,
    };
    Ok(Fenced::Stale(Stale { access, highest, got: token }))
}

async fn marks_of(client: &impl GenericClient, key: &str) -> Result<Option<Marks>, FenceError> {
    let row = client.query_opt(MARKS_SQL, &[&key]).await.map_err(FenceError::storage)?;
    Ok(row.map(|r| Marks { seen: r.get::<_, i64>(0) as u64, write: r.get::<_, i64>(1) as u64 }))
}

#[async_trait]
impl Fence for PgFence {
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        admit_in(&self.client, key, token, access).await
    }

    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        check_key(key)?;
        marks_of(&self.client, key).await
    }
}
