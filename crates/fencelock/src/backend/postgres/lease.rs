//! The lease-table mode of the PostgreSQL backend (the default): locks as rows
//! of a table, expiry by the database's clock, global fencing tokens from a
//! sequence, a FIFO queue, waiters woken by `LISTEN/NOTIFY`, holders'
//! identities and values, and leader election (module `election`).
//!
//! Where it sits: [`super::PgBackend`] in `mode=lease`. Each backend instance
//! has one connection for statements (tokio-postgres pipelines the statements
//! of concurrent tasks on it; it is reopened when it drops) and one listening
//! connection (module `listen`). Guards renew through the shared
//! `KeptLease` watchdog. Laid out by concern, one module each: `conn` (the
//! statement connection, reopened after it drops or stalls), `sql` (the
//! table layout and the statements), `store` (the statements as calls, and
//! rows as values), `recipe` (try, queue, wake-ups, withdrawal), `held` (the
//! guard: renewal, release, new value), `shared` (read-write locks and
//! semaphores) and `election`; the URL's parameters are read by
//! [`super::PgBackend`].
//!
//! # Schema
//! Created at connect if missing, inside a transaction holding
//! `pg_advisory_xact_lock(1718382435, hashtext('<table>'))` so that two clients
//! starting at once do not race on the DDL (the two-key form cannot collide with
//! the advisory mode's one-key locks). A role without `CREATE` works once the
//! objects exist.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "<table>" (     -- one permanent row per lock name
//!     name       text PRIMARY KEY,
//!     token      bigint,                     -- the last grant's token
//!     owner      text,                       -- the holder's request id; NULL when free
//!     expires_at timestamptz                 -- by the database's clock; NULL when free
//! );
//! CREATE SEQUENCE IF NOT EXISTS "<table>_token_seq" AS bigint;
//! CREATE TABLE IF NOT EXISTS "<table>_waiters" (
//!     id         bigserial PRIMARY KEY,      -- arrival order
//!     name       text NOT NULL,
//!     owner      text NOT NULL,
//!     expires_at timestamptz NOT NULL        -- refreshed by the waiter every TTL/3
//! );
//! CREATE INDEX IF NOT EXISTS "<table>_waiters_name" ON "<table>_waiters" (name, id);
//! CREATE TABLE IF NOT EXISTS "<table>_holders" (    -- what a grant published
//!     name       text PRIMARY KEY,
//!     token      bigint NOT NULL,            -- the grant it belongs to
//!     identity   text,                       -- LockOptions::identity
//!     value      bytea NOT NULL              -- LockOptions::value, or the last set_value
//! );
//! ```
//!
//! A table made by an earlier version has no holders table: the next
//! connect creates it, which needs `CREATE` on the schema once (as the other
//! objects did); a role without it fails to connect until someone with it
//! has connected (or run the DDL above).
//!
//! `owner` is unique per acquire request (`<random instance id>-<counter>`),
//! so a request can be withdrawn by owner alone, whatever it did on the server.
//! Every statement binds its values (`$1` name, `$2` owner, `$3` TTL in µs, …);
//! only the checked table name is spliced in. The statements and the DDL
//! are `.sql` files in `lease/sql/` (loaded with `include_str!`), where the
//! table is written `{table}`: see `Table` in [`super`] for why splicing it
//! is safe.
//!
//! # Grant: one statement
//! `$4` is the request's queue id, or `i64::MAX` for a first try (then every
//! live waiter is ahead of it: a try never overtakes a waiter).
//!
//! ```sql
//! WITH ahead AS (       -- live waiters that came first
//!     SELECT count(*) AS n, min(expires_at) AS first_expiry FROM "<table>_waiters"
//!     WHERE name = $1 AND id < $4 AND expires_at > clock_timestamp()
//! ), cur AS (
//!     SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() AS held, expires_at
//!     FROM "<table>" WHERE name = $1
//! ), created AS (       -- the first grant of a name creates its row
//!     INSERT INTO "<table>" (name, token, owner, expires_at)
//!     SELECT $1, nextval('"<table>_token_seq"'), $2, clock_timestamp() + $3 * interval '1 microsecond'
//!     WHERE NOT EXISTS (SELECT 1 FROM cur) AND (SELECT n FROM ahead) = 0
//!     ON CONFLICT (name) DO NOTHING RETURNING token
//! ), taken AS (         -- every later grant updates it
//!     UPDATE "<table>" SET token = nextval('"<table>_token_seq"'), owner = $2,
//!         expires_at = clock_timestamp() + $3 * interval '1 microsecond'
//!     WHERE name = $1 AND ((owner IS NULL OR expires_at <= clock_timestamp()) AND (SELECT n FROM ahead) = 0
//!         OR owner = $2 AND expires_at > clock_timestamp())   -- an earlier attempt's answer was lost
//!     RETURNING token
//! ), granted AS (SELECT token FROM created UNION ALL SELECT token FROM taken
//! ), described AS (     -- identity ($5) and value ($6), if the request has either
//!     INSERT INTO "<table>_holders" (name, token, identity, value)
//!     SELECT $1, token, $5, $6 FROM granted WHERE $5 IS NOT NULL OR length($6) > 0
//!     ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, identity = EXCLUDED.identity,
//!         value = EXCLUDED.value WHERE "<table>_holders".token <= EXCLUDED.token
//! ), dequeued AS (DELETE FROM "<table>_waiters" WHERE id = $4 AND EXISTS (SELECT 1 FROM granted)
//! ), refreshed AS (     -- a waiter that was not granted keeps its place, if it still has one
//!     UPDATE "<table>_waiters" SET expires_at = clock_timestamp() + $3 * interval '1 microsecond'
//!     WHERE id = $4 AND expires_at > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM granted)
//!     RETURNING id
//! )
//! SELECT (SELECT token FROM granted), <holder's token and time left>, <waiters ahead, and the
//!        time until the first of them expires>, <live waiters>, EXISTS (SELECT 1 FROM refreshed)
//! ```
//!
//! **Why the token cannot go backwards.** The token is drawn in the `SET` of the
//! `UPDATE`, which PostgreSQL evaluates for the version of the row it is about
//! to replace. If another transaction changed the row after this statement's
//! snapshot (a grant or a release), the `UPDATE` waits for it to commit and then
//! re-evaluates the row, its `WHERE` and its `SET` (READ COMMITTED's
//! EvalPlanQual): the token is drawn again, after the previous grant committed,
//! so it is larger than that grant's. A `nextval()` evaluated before the row is
//! locked (e.g. in the `VALUES` of an `INSERT … ON CONFLICT`) is drawn before the
//! insert blocks on the holder's row and goes backwards under contention (the
//! project measured 14.5 % of grants). The `INSERT` path draws before its row
//! exists, but it only grants a name's very first time: a conflicting
//! concurrent insert makes it do nothing. Rows are never deleted, so every grant
//! of a name after its first goes through the `UPDATE`. The sequence is global,
//! so tokens also increase across locks ([`Fencing::Global`]): a grant that
//! starts after another was acknowledged draws a larger number.
//!
//! **Durability.** A grant is one autocommit statement; with `synchronous_commit`
//! on (the connection raises it to `on` if the server's default is `off`) it is
//! in the WAL on disk when acknowledged, the sequence's WAL record with it, so
//! after a crash neither the grant nor the token counter goes back.
//!
//! # Waiting
//! A waiting acquire first tries as above. If that fails it enqueues
//! (`INSERT INTO "<table>_waiters" … RETURNING id`, after deleting any earlier
//! entry of the same request), then repeats the grant statement with its id
//! whenever (a) a notification for it arrives (see module `listen`), (b) the
//! time the last attempt reported passes: the holder's expiry by the
//! database's clock if no one is ahead, or the first expiry of a waiter ahead
//! (a crashed waiter), or (c) TTL/3 passed, when its queue entry needs
//! refreshing (the entry expires after the acquire's TTL, so a crashed waiter
//! blocks the queue for at most that long). A waiter whose entry expired (it
//! stalled longer than its TTL) loses its place and enqueues again, at the
//! back. A connection failure while waiting is retried until the wait runs out
//! (the grant statement grants again to a request that already holds the lock,
//! in case the answer to an earlier attempt was lost). When the wait runs out,
//! or the acquire future is dropped, the request is withdrawn:
//!
//! ```sql
//! WITH gone AS (DELETE FROM "<table>_waiters" WHERE name = $1 AND owner = $2 RETURNING id),
//!      freed AS (UPDATE "<table>" SET owner = NULL, expires_at = NULL
//!                WHERE name = $1 AND owner = $2 RETURNING 1)   -- a grant nobody received
//! SELECT EXISTS (SELECT 1 FROM freed)                          -- then wake the next waiter
//!     OR EXISTS (SELECT 1 FROM gone WHERE NOT EXISTS (<a live waiter of $1 with a smaller id>))
//! ```
//!
//! # Waking the next waiter
//! After a release or a withdrawal that lets the next waiter go has committed,
//! the client sends one more statement:
//!
//! ```sql
//! SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, id::text || ':' || $1)
//! FROM (SELECT min(id) AS id FROM "<table>_waiters" WHERE name = $1 AND expires_at > clock_timestamp()) head
//! WHERE id IS NOT NULL
//! ```
//!
//! It runs after the change committed, so its snapshot sees every waiter whose
//! last attempt could have missed the change (that waiter enqueued before its
//! attempt, which began before the change committed). It notifies only if
//! someone waits: PostgreSQL serialises the commits of all notifying
//! transactions, so a release without waiters must not notify; and the
//! notification's own commit need not wait for the disk (a lost wake-up costs
//! a timer, not safety). Only the waiter it names wakes up.
//!
//! # Renew, release, check
//! A grant is its own lease: the guard's lease id (and `Busy::holder_lease`) is
//! its token.
//!
//! ```sql
//! -- renew: no row means the lock is no longer ours (Renewed::Gone)
//! UPDATE "<table>" SET expires_at = clock_timestamp() + $4 * interval '1 microsecond'
//! WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1;
//! -- release: compare-and-delete (and sweep expired waiters); then wake the next waiter
//! WITH released AS (UPDATE "<table>" SET owner = NULL, expires_at = NULL
//!                   WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1),
//!      swept AS (DELETE FROM "<table>_waiters" WHERE name = $1 AND expires_at <= clock_timestamp())
//! SELECT count(*) FROM released;
//! -- check
//! SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() FROM "<table>" WHERE name = $1;
//! ```
//!
//! # Holders, new values, leader election
//! A holders row counts only for the grant of its token: a lock held by a
//! grant that stored none (or whose row a later grant of a request with an
//! identity or value replaced) shows no identity and an empty value. A new
//! value (`Guard::set_value`, `Leadership::proclaim`) is a compare-and-set
//! that locks the grant's lock row first (as a grant does, so the two are
//! serialised and the new value never lands on a newer grant):
//!
//! ```sql
//! WITH mine AS (SELECT name, token FROM "<table>"
//!               WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() FOR UPDATE)
//! INSERT INTO "<table>_holders" (name, token, identity, value) SELECT name, token, $4, $5 FROM mine
//! ON CONFLICT (name) DO UPDATE … (as in the grant) RETURNING 1;   -- no row: not ours any more
//! -- leader: the live holder and its row
//! SELECT l.token, h.identity, h.value, <time left> FROM "<table>" l
//! LEFT JOIN "<table>_holders" h ON h.name = l.name AND h.token = l.token
//! WHERE l.name = $1 AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
//! ```
//!
//! A campaign is an acquire that fails with `Error::LeaseNotFound` instead of
//! queueing again when its queue entry expired. After a campaign's grant or
//! release, and after every new value, has committed, the client announces
//! it, `pg_notify(<table>, '0:<name>')` (with `synchronous_commit` off, like
//! a wake-up): plain locks never pay for a notification. Queue ids start at
//! 1, so it names no waiter; it wakes the observers of the name (registered
//! without an id) and a waiter still enqueueing, which only looks again.
//! Observers are described in module `election`.
//!
//! # Guarantees, and what is not guaranteed
//! * At most one live grant per name by the database's clock; the client's
//!   deadline (send time of the last confirmed statement + TTL) is never later
//!   than the row's `expires_at` (the TTL is rounded up to the microsecond).
//!   Clock *rate* differences between client and server aside, the client's
//!   clock decides nothing.
//! * Tokens strictly increase in grant order, across all locks of the table, and
//!   across crashes of the server.
//! * FIFO by queue id; a try never overtakes a live waiter. A waiter that stalls
//!   past its TTL goes to the back.
//! * Expiry is checked when someone asks (an attempt, a renewal): nothing runs in
//!   the database in the background. A crashed holder blocks the lock for at
//!   most its TTL, a crashed waiter blocks the queue for at most its TTL.
//! * A waiter's attempt that is cut off mid-flight (the future dropped, the
//!   connection lost) is withdrawn by owner; if the statement was on a
//!   connection that died and the server ran it anyway after the withdrawal,
//!   the orphaned grant blocks the lock until its TTL.
//! * One statement connection per backend instance: its statements run one
//!   after another on the server. Use more instances for more throughput.
//! * Not replicated by itself; see the module docs of [`super`].
//!
//! [`Fencing::Global`]: super::super::Fencing::Global

mod conn;
mod election;
mod held;
mod recipe;
mod shared;
mod sql;
mod store;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::listen::{Registration, Wakers};
use super::tls::PgConfig as Config;
use super::{spawn_detached, AbortOnDrop, Table, STATEMENT_TIMEOUT};
use crate::backend::{Capabilities, Fencing, Guard, Outcome};
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use conn::{Db, Failed};
use held::{lease_guard, TableGrant};
use recipe::Purpose;
use sql::{ensure_schema, Sql};
use store::{column, kind_of, micros, one, to_token};

/// What the lease-table mode guarantees (see the module docs):
/// * `fencing: Global`, `durable_tokens: true`: one sequence, drawn after the
///   row is locked, WAL-logged before the grant commits;
/// * `fifo: true`: the queue table, and tries that never overtake it;
/// * `push_wakeup: true`: `NOTIFY` names the next waiter, and only it wakes;
///   the waiters' own timers are the holder's expiry (no one frees an expired
///   lock) and the refresh of their queue entry (TTL/3);
/// * `server_ttl: true`: expiry by the database's clock (checked when asked);
/// * `survives_failover: false`: one primary (see [`super`]);
/// * `holder_identity: true`: the holders table (see the module docs);
/// * `election: true`: a campaign is an acquire that fails rather than queue
///   again; observers are woken by `NOTIFY` and read the leader (see module
///   `election`);
/// * `shared: true`, `semaphores: true`: shared holders admitted from the
///   same queue under the lock row's lock (see `lease/shared.rs`; weighted;
///   no downgrade);
/// * `lock_delay: false`; `min_ttl`: 100 ms (kept to the microsecond).
pub const CAPABILITIES: Capabilities = Capabilities {
    fencing: Fencing::Global,
    durable_tokens: true,
    fifo: true,
    push_wakeup: true,
    server_ttl: true,
    survives_failover: false,
    lock_delay: false,
    holder_identity: true,
    election: true,
    shared: true,
    semaphores: true,
    hold_at_least: false,
    once_per: false,
    multi_lock: false,
    min_ttl: Duration::from_millis(100),
};

/// The queue id of a request that has not enqueued: every live waiter is ahead.
const NOT_QUEUED: i64 = i64::MAX;

/// The lease-table mode of one [`super::PgBackend`].
pub(super) struct LeaseMode {
    store: Arc<Store>,
    wakers: Arc<Wakers>,
    _listener: AbortOnDrop,
    /// Random per instance: makes `owner` unique across clients.
    instance: u64,
    requests: AtomicU64,
}

impl LeaseMode {
    /// Connects the statement connection, creates the schema if missing, and
    /// starts listening on the table's channel.
    pub async fn connect(config: Config, table: Table) -> Result<LeaseMode, Error> {
        let db = Db::connect(config.clone()).await?;
        ensure_schema(&db, &table).await?;
        let wakers = Wakers::new();
        let listener = super::listen::start(config, table.as_str().to_string(), wakers.clone()).await?;
        let store = Arc::new(Store { db, sql: Sql::new(&table), table: table.as_str().to_string() });
        Ok(LeaseMode {
            store,
            wakers,
            _listener: listener,
            instance: crate::unique::u64(),
            requests: AtomicU64::new(0),
        })
    }

    pub fn table(&self) -> &str {
        &self.store.table
    }

    /// Takes `name` (already admitted): one try if `opts.wait` is zero, else a
    /// try, then the queue until `opts.wait` runs out. See the module docs.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Outcome<Guard>, Error> {
        self.acquire_as(name, opts, Purpose::Lock).await
    }

    /// A campaign for `name` (already admitted): an acquire whose loss of its
    /// queue entry ends it, and whose grant is announced.
    pub async fn campaign(&self, name: &str, opts: &LockOptions) -> Result<Outcome<Guard>, Error> {
        if kind_of(opts) != "x" {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        self.acquire_as(name, opts, Purpose::Campaign).await
    }

    /// Is `token` a live grant of `name` (the exclusive holder's, or a
    /// shared holder's), by the database's clock? `current_token` is `token`
    /// if so, else the highest live grant's.
    pub async fn check(&self, name: &str, token: u64) -> Result<CheckResult, Error> {
        let by = crate::clock::now() + STATEMENT_TIMEOUT;
        let rows = self.store.db.query("check", &self.store.sql.check, &[(&name, Type::TEXT)], by).await?;
        let mut live = shared::live_tokens(&self.store, name).await?;
        if let Some(row) = rows.first() {
            if column::<bool>(row, 1)? {
                live.push(to_token(column(row, 0)?)?);
            }
        }
        let current = live.contains(&token);
        let current_token = if current { Some(token) } else { live.into_iter().max() };
        Ok(CheckResult { current, current_token })
    }
}

/// What every statement of this mode needs: the connection, the SQL.
struct Store {
    db: Db,
    sql: Sql,
    /// Also the `LISTEN/NOTIFY` channel.
    table: String,
}
