//! Read-write locks and semaphores on the lease table: shared holders in
//! their own table, admitted from the lock's FIFO queue under the lock row's
//! lock.
//!
//! Where it sits: under [`super::LeaseMode`]. The waiting loop, the queue and
//! the wake-ups are the exclusive lock's (`lease.rs`), and so is the guard's
//! `Held` part (`LeaseHeld`, over either grant); this module has the schema
//! additions, the three PL/pgSQL functions that admit, renew and release a
//! shared grant, and that grant (`SharedGrant`).
//!
//! # Schema additions
//! ```sql
//! ALTER TABLE "<table>" ADD COLUMN IF NOT EXISTS shared_until timestamptz;  -- latest live shared expiry
//! ALTER TABLE "<table>_waiters" ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'x',  -- x, r, s
//!     ADD COLUMN IF NOT EXISTS weight int NOT NULL DEFAULT 1,
//!     ADD COLUMN IF NOT EXISTS permits int NOT NULL DEFAULT 0;
//! CREATE TABLE IF NOT EXISTS "<table>_shared" (     -- the shared holders
//!     name text NOT NULL, owner text NOT NULL, token bigint NOT NULL,
//!     weight int NOT NULL, permits int NOT NULL,     -- permits 0: a reader
//!     expires_at timestamptz NOT NULL, PRIMARY KEY (name, owner));
//! ```
//! The holders table keeps what an exclusive grant published (one row per
//! lock, its primary key the name, which the election's queries and upserts
//! rely on), so the shared holders, many per lock, have a table of their own.
//!
//! # Admission: `"<table>_share"(name, owner, ttl µs, queue id, kind, weight, permits)`
//! One statement, a PL/pgSQL function, so one transaction in which every
//! statement after the first sees what committed before it: it creates the
//! lock row if missing and locks it (`SELECT … FOR UPDATE`), drops expired
//! shared holders, and then
//! * answers the same grant again to a request that holds one already (a
//!   retried attempt whose answer was lost);
//! * refuses another N: the N of a live shared holder, else of a live
//!   semaphore waiter (a reader's N is 0), so a reader of a semaphore's name
//!   is refused too; the answer names both;
//! * admits a reader when no exclusive holder is live and no live waiter of
//!   another kind is ahead of it, k permits when no exclusive holder is live,
//!   no live waiter at all is ahead, and the weights held plus k are at most
//!   N (FIFO across modes and weights; a try is "behind" every live waiter);
//! * grants with a token drawn from the table's sequence after the row lock
//!   (so tokens increase in grant order, as for the exclusive lock), a row of
//!   `"<table>_shared"`, and `shared_until` raised to the grant's expiry.
//!
//! The exclusive grant statement admits only when `shared_until` has passed,
//! a column of the lock row, which PostgreSQL re-reads after waiting for the
//! row's lock (EvalPlanQual): a shared grant and an exclusive one cannot both
//! pass. Renewal (`"<table>_reshare"`) and release (`"<table>_unshare"`) also
//! lock the row first; release lowers `shared_until` to the latest live
//! shared expiry.
//!
//! # Not guaranteed
//! * No downgrade ([`crate::Guard::downgrade`] fails with
//!   [`Error::Unsupported`]); a shared grant publishes no identity or value.
//! * An exclusive acquire of a semaphore's name is not refused: it waits for
//!   the semaphore's holders like a writer for readers.
//! * A shared grant withdrawn after its answer was lost leaves `shared_until`
//!   where it was: a writer then waits until that time at most.
//! * Creating the functions needs `CREATE` on the schema, once (as the tables
//!   did).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};

use super::{column, one, to_token, Store, Table, TableGrant, STATEMENT_TIMEOUT};
use crate::backend::{BoxFuture, Guard, Renew, Renewed};
use crate::error::Error;
use crate::types::LockOptions;

/// The refusal of a request for `asked` permits (0: not a semaphore) of a
/// lock that keeps `kept`.
pub(super) fn mismatch(kept: u32, asked: u32) -> Error {
    Error::InvalidArgument(format!(
        "permits mismatch: the lock has {kept} permits, the acquire asked for {asked} (0 = not a semaphore)"
    ))
}

/// The schema additions and functions of the module docs, for `table`
/// (inside the schema's transaction): `sql/schema_shared.sql`.
pub(super) fn schema_sql(table: &Table) -> String {
    table.render(include_str!("sql/schema_shared.sql"))
}

/// The statements of the shared grants, with the table name spliced in.
pub(super) struct SharedSql {
    pub(super) attempt: String,
    renew: String,
    release: String,
    /// The tokens of the live shared holders of `$1`.
    pub(super) tokens: String,
}

impl SharedSql {
    pub(super) fn new(table: &Table) -> SharedSql {
        SharedSql {
            attempt: table.render(include_str!("sql/shared_attempt.sql")),
            renew: table.render(include_str!("sql/shared_renew.sql")),
            release: table.render(include_str!("sql/shared_release.sql")),
            tokens: table.render(include_str!("sql/shared_tokens.sql")),
        }
    }
}

/// The guard of a shared grant of `opts` to `owner`, confirmed by a statement
/// sent at `sent`.
pub(super) fn guard(
    store: Arc<Store>,
    name: &str,
    owner: String,
    opts: &LockOptions,
    token: u64,
    sent: Instant,
) -> Guard {
    let grant = Arc::new(SharedGrant { store, name: name.to_string(), owner, ttl: opts.ttl });
    super::lease_guard(name, token, opts.ttl, sent, grant)
}

/// One shared grant: its lock and owner (unique per request).
struct SharedGrant {
    store: Arc<Store>,
    name: String,
    owner: String,
    ttl: Duration,
}

impl TableGrant for SharedGrant {
    fn name(&self) -> &str {
        &self.name
    }

    /// `"<table>_unshare"`; then wakes the next waiter if it released.
    fn release(&self) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let by = crate::clock::now() + STATEMENT_TIMEOUT;
            let params: [(&(dyn ToSql + Sync), Type); 2] = [(&self.name, Type::TEXT), (&self.owner, Type::TEXT)];
            let rows = self.store.db.query("release", &self.store.sql.shared.release, &params, by).await?;
            let released: bool = column(one(&rows, "release")?, 0)?;
            if released {
                self.store.wake(&self.name).await;
            }
            Ok(released)
        })
    }

    fn set_value(&self, _value: Vec<u8>) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async {
            Err(Error::Unsupported("postgres keeps no value for a shared grant (a reader's or a permit)".into()))
        })
    }

    /// A shared grant is no exclusive grant to turn shared: `Ok(false)`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async { Ok(false) }))
    }
}

impl Renew for SharedGrant {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let ttl_us = super::micros(self.ttl);
            let params: [(&(dyn ToSql + Sync), Type); 3] =
                [(&self.name, Type::TEXT), (&self.owner, Type::TEXT), (&ttl_us, Type::INT8)];
            let rows = self.store.db.query("renew", &self.store.sql.shared.renew, &params, round_end).await?;
            let held: bool = column(one(&rows, "renew")?, 0)?;
            Ok(if held { Renewed::Confirmed(Some(self.ttl)) } else { Renewed::Gone })
        })
    }
}

/// The live shared tokens of `name`.
pub(super) async fn live_tokens(store: &Store, name: &str) -> Result<Vec<u64>, Error> {
    let by = crate::clock::now() + STATEMENT_TIMEOUT;
    let rows = store.db.query("check", &store.sql.shared.tokens, &[(&name, Type::TEXT)], by).await?;
    rows.iter().map(|row| to_token(column(row, 0)?)).collect()
}
