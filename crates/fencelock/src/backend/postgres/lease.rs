//! The lease-table mode of the PostgreSQL backend (the default): locks as rows
//! of a table, expiry by the database's clock, global fencing tokens from a
//! sequence, a FIFO queue, waiters woken by `LISTEN/NOTIFY`, holders'
//! identities and values, and leader election (module `election`).
//!
//! Where it sits: [`super::PgBackend`] in `mode=lease`. Each backend instance
//! has one connection for statements (tokio-postgres pipelines the statements
//! of concurrent tasks on it; it is reopened when it drops) and one listening
//! connection (module `listen`). Guards renew through the shared
//! `KeptLease` watchdog.
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
//! only the checked table name is spliced in.
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row};

use super::tls::PgConfig as Config;

mod election;
mod shared;

use super::listen::{Registration, Wakers};
use super::{backend_error, bounded, open, spawn_detached, AbortOnDrop, OpenFailed, STATEMENT_TIMEOUT};
use crate::backend::Acquire;
use crate::backend::{BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, Renew, Renewed};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};

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

/// What a request is for, which decides what losing its queue entry means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A lock: an entry that expired is made again, at the back.
    Lock,
    /// A campaign: a candidate whose entry expired is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does; its grant
    /// and its release are announced to observers.
    Campaign,
}

/// A connection after which one statement waited this long without an answer is
/// presumed dead (a silent peer) and is replaced.
const STALL: Duration = STATEMENT_TIMEOUT;

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
    pub async fn connect(config: Config, table: String) -> Result<LeaseMode, Error> {
        let db = Db::connect(config.clone()).await?;
        ensure_schema(&db, &table).await?;
        let wakers = Wakers::new();
        let listener = super::listen::start(config, table.clone(), wakers.clone()).await?;
        let store = Arc::new(Store { db, sql: Sql::new(&table), table });
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
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Acquire<Guard>, Error> {
        self.acquire_as(name, opts, Purpose::Lock).await
    }

    /// [`acquire`](Self::acquire) for a lock or a campaign (`purpose`).
    async fn acquire_as(&self, name: &str, opts: &LockOptions, purpose: Purpose) -> Result<Acquire<Guard>, Error> {
        let owner = format!("{:016x}-{}", self.instance, self.requests.fetch_add(1, Ordering::Relaxed));
        let deadline = Instant::now() + opts.wait;
        let registration = self.wakers.register(name);
        let mut withdraw =
            Withdraw { store: self.store.clone(), name: name.to_string(), owner: owner.clone(), armed: true };
        let sent = Instant::now();
        match self.store.attempt(name, &owner, opts, NOT_QUEUED).await {
            Ok(Seen { mismatch: Some(kept), .. }) => {
                withdraw.armed = false; // nothing was written
                return Err(shared::mismatch(kept, opts.permits));
            }
            Ok(Seen { granted: Some(token), .. }) => {
                withdraw.armed = false;
                return Ok(Acquire::Acquired(self.granted(name, owner, opts, token, sent, purpose).await));
            }
            Ok(seen) if opts.wait.is_zero() => {
                withdraw.armed = false; // nothing was written
                return Ok(seen.busy());
            }
            Ok(_) => {}
            Err(failed) if failed.transient && !opts.wait.is_zero() => {} // the wait retries
            Err(failed) => return Err(failed.error),
        }
        match self.wait(name, &owner, opts, deadline, &registration, purpose).await? {
            Some((token, sent)) => {
                withdraw.armed = false;
                Ok(Acquire::Acquired(self.granted(name, owner, opts, token, sent, purpose).await))
            }
            None => {
                if self.store.withdraw(name, &owner).await.is_ok() {
                    withdraw.armed = false;
                }
                Ok(Acquire::TimedOut)
            }
        }
    }

    /// Waits in the queue until granted (the token, and the send time of the
    /// statement that granted) or `deadline` (`None`). A failure of the
    /// connection is retried (with backoff) until the deadline, as the request's
    /// owner makes every step safe to repeat: the queue entry is replaced, and a
    /// grant whose answer was lost is granted again. Other failures end the wait,
    /// and so does, for a campaign, the loss of its queue entry.
    async fn wait(
        &self,
        name: &str,
        owner: &str,
        opts: &LockOptions,
        deadline: Instant,
        registration: &Registration,
        purpose: Purpose,
    ) -> Result<Option<(u64, Instant)>, Error> {
        let ttl_us = micros(opts.ttl);
        let mut id = None;
        let mut failures = 0u32;
        let mut races = 0u32;
        loop {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            let step = match id {
                None => self.store.enqueue(name, owner, ttl_us, opts).await.map(|queued| {
                    registration.set_id(queued);
                    id = Some(queued);
                    None
                }),
                Some(queued) => self.step(name, owner, opts, queued, &mut races).await,
            };
            let wake = match step {
                Ok(Some(Step::Granted(token, sent))) => return Ok(Some((token, sent))),
                Ok(Some(Step::Requeue)) if purpose == Purpose::Campaign => {
                    return Err(Error::LeaseNotFound(format!(
                        "postgres: the queue entry of a waiting campaign for {name:?} expired (it stalled past its TTL)"
                    )));
                }
                Ok(Some(Step::Requeue)) => {
                    id = None;
                    continue;
                }
                Ok(Some(Step::SleepUntil(wake))) => {
                    failures = 0;
                    wake
                }
                Ok(None) => continue, // enqueued: attempt at once
                Err(failed) if failed.transient && Instant::now() < deadline => {
                    failures = failures.saturating_add(1);
                    let error = &failed.error;
                    tracing::debug!(lock = name, failures, %error, "fencelock: postgres: waiting: retrying");
                    Instant::now() + Backoff::default().delay(failures - 1, fastrand::f64())
                }
                Err(failed) => return Err(failed.error),
            };
            tokio::select! {
                _ = registration.notified() => {}
                _ = tokio::time::sleep_until(wake.min(deadline)) => {}
            }
        }
    }

    /// One attempt of a queued request (queue id `id`), and what to do next.
    async fn step(
        &self,
        name: &str,
        owner: &str,
        opts: &LockOptions,
        id: i64,
        races: &mut u32,
    ) -> Result<Option<Step>, Failed> {
        let sent = Instant::now();
        let seen = self.store.attempt(name, owner, opts, id).await?;
        if let Some(kept) = seen.mismatch {
            return Err(shared::mismatch(kept, opts.permits).into());
        }
        if let Some(token) = seen.granted {
            return Ok(Some(Step::Granted(token, sent)));
        }
        if !seen.queued {
            // Our entry expired (we stalled past the TTL): back of the queue.
            return Ok(Some(Step::Requeue));
        }
        let next = match seen.next_change() {
            Some(Duration::ZERO) => {
                // Free and nobody ahead, yet not granted: another grant or a new
                // row raced this one. Look again soon.
                *races = races.saturating_add(1);
                Instant::now() + Backoff::default().delay(*races - 1, fastrand::f64())
            }
            Some(left) => {
                *races = 0;
                Instant::now() + left
            }
            None => sent + opts.ttl / 3,
        };
        // Whatever comes first; the entry is refreshed by the next attempt.
        Ok(Some(Step::SleepUntil(next.min(sent + opts.ttl / 3))))
    }

    /// The guard of a grant of `opts` confirmed by a statement sent at `sent`;
    /// a campaign's grant is announced to observers.
    async fn granted(
        &self,
        name: &str,
        owner: String,
        opts: &LockOptions,
        token: u64,
        sent: Instant,
        purpose: Purpose,
    ) -> Guard {
        if shared::kind_of(opts) != "x" {
            // The next waiter may share too.
            self.store.wake(name).await;
            return shared::guard(self.store.clone(), name, owner, opts, token, sent);
        }
        let announced = purpose == Purpose::Campaign;
        let grant = Arc::new(Grant {
            store: self.store.clone(),
            name: name.to_string(),
            owner,
            token,
            ttl: opts.ttl,
            identity: opts.identity.clone(),
            announced,
        });
        let guard = lease_guard(name, token, opts.ttl, sent, grant);
        if announced {
            self.store.announce(name).await;
        }
        guard
    }

    /// A campaign for `name` (already admitted): an acquire whose loss of its
    /// queue entry ends it, and whose grant is announced.
    pub async fn campaign(&self, name: &str, opts: &LockOptions) -> Result<Acquire<Guard>, Error> {
        if shared::kind_of(opts) != "x" {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        self.acquire_as(name, opts, Purpose::Campaign).await
    }

    /// Is `token` a live grant of `name` (the exclusive holder's, or a
    /// shared holder's), by the database's clock? `current_token` is `token`
    /// if so, else the highest live grant's.
    pub async fn check(&self, name: &str, token: u64) -> Result<CheckResult, Error> {
        let by = Instant::now() + STATEMENT_TIMEOUT;
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

/// What one grant attempt saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The token, if this attempt was granted.
    granted: Option<u64>,
    /// The holder's token, if the lock was held.
    holder_token: Option<u64>,
    /// Time left to the holder, by the database's clock.
    holder_left: Option<Duration>,
    /// Live waiters ahead of this request.
    ahead: u64,
    /// Time until the first of those expires, by the database's clock.
    ahead_left: Option<Duration>,
    /// Live waiters of the lock.
    waiters: u32,
    /// This request's queue entry is live (refreshed by the attempt).
    queued: bool,
    /// The lock keeps another semaphore size (0: not a semaphore); nothing
    /// was done.
    mismatch: Option<u32>,
}

impl Seen {
    fn from_row(row: &Row) -> Result<Seen, Error> {
        let left = |i| -> Result<Option<Duration>, Error> {
            let us: Option<i64> = column(row, i)?;
            Ok(us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
        };
        let ahead: Option<i64> = column(row, 3)?;
        let waiters: Option<i64> = column(row, 5)?;
        Ok(Seen {
            granted: column::<Option<i64>>(row, 0)?.map(to_token).transpose()?,
            holder_token: column::<Option<i64>>(row, 1)?.map(to_token).transpose()?,
            holder_left: left(2)?,
            ahead: ahead.and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
            ahead_left: left(4)?,
            waiters: waiters.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            queued: column(row, 6)?,
            mismatch: column::<Option<i32>>(row, 7)?.map(|n| u32::try_from(n).unwrap_or(0)),
        })
    }

    /// When what blocks this request may change by itself: the first waiter
    /// ahead expiring, or (nobody ahead) the holder expiring (an exclusive
    /// holder, or for shared holders the first or the last of them, as the
    /// attempt reported); zero if nothing blocked it (a race); `None` if
    /// nothing will change without a notification.
    fn next_change(&self) -> Option<Duration> {
        if self.ahead > 0 {
            self.ahead_left
        } else if self.holder_token.is_some() || self.holder_left.is_some() {
            self.holder_left
        } else {
            Some(Duration::ZERO)
        }
    }

    /// The outcome of a try that was not granted.
    fn busy(&self) -> Acquire<Guard> {
        Acquire::Busy {
            holder_lease: self.holder_token,
            holder_token: self.holder_token,
            reopens_in: None,
            waiters: self.waiters,
        }
    }
}

/// What a waiting request does after one attempt.
enum Step {
    /// Granted this token by a statement sent at that instant.
    Granted(u64, Instant),
    /// Its queue entry had expired: enqueue again.
    Requeue,
    /// Sleep until then, or until notified.
    SleepUntil(Instant),
}

impl Store {
    /// One grant attempt (module docs); `id` is the request's queue id or
    /// [`NOT_QUEUED`].
    async fn attempt(&self, name: &str, owner: &str, opts: &LockOptions, id: i64) -> Result<Seen, Failed> {
        if shared::kind_of(opts) != "x" {
            return self.attempt_shared(name, owner, opts, id).await;
        }
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let (ttl_us, identity, value) = (micros(opts.ttl), opts.identity.as_deref(), opts.value.as_slice());
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&id, Type::INT8),
            (&identity, Type::TEXT),
            (&value, Type::BYTEA),
        ];
        let rows = self.db.query("grant", &self.sql.attempt, &params, by).await?;
        Ok(Seen::from_row(one(&rows, "grant")?)?)
    }

    /// One attempt of a shared request: `"<table>_share"` (see
    /// `lease/shared.rs`), whose answer has the grant statement's columns.
    async fn attempt_shared(&self, name: &str, owner: &str, opts: &LockOptions, id: i64) -> Result<Seen, Failed> {
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let (ttl_us, kind) = (micros(opts.ttl), shared::kind_of(opts));
        let (weight, permits) = (weight_param(opts), permits_param(opts));
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&id, Type::INT8),
            (&kind, Type::TEXT),
            (&weight, Type::INT4),
            (&permits, Type::INT4),
        ];
        let rows = self.db.query("grant", &self.sql.shared.attempt, &params, by).await?;
        Ok(Seen::from_row(one(&rows, "grant")?)?)
    }

    /// Enqueues the request (dropping any earlier entry of it) with its kind,
    /// weight and permits: its queue id.
    async fn enqueue(&self, name: &str, owner: &str, ttl_us: i64, opts: &LockOptions) -> Result<i64, Failed> {
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let (kind, weight, permits) = (shared::kind_of(opts), weight_param(opts), permits_param(opts));
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&name, Type::TEXT),
            (&owner, Type::TEXT),
            (&ttl_us, Type::INT8),
            (&kind, Type::TEXT),
            (&weight, Type::INT4),
            (&permits, Type::INT4),
        ];
        let rows = self.db.query("enqueue", &self.sql.enqueue, &params, by).await?;
        Ok(column(one(&rows, "enqueue")?, 0)?)
    }

    /// Withdraws the request: its queue entry, and a grant it never received;
    /// then wakes the next waiter if the request was first in line or held a
    /// grant.
    async fn withdraw(&self, name: &str, owner: &str) -> Result<(), Error> {
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&owner, Type::TEXT)];
        let rows = self.db.query("withdraw", &self.sql.withdraw, &params, by).await?;
        if column::<bool>(one(&rows, "withdraw")?, 0)? {
            self.wake(name).await;
        }
        Ok(())
    }

    /// Notifies the oldest live waiter of `name`, if there is one. Run after
    /// the statement that freed the lock (or left the queue) committed: its
    /// snapshot sees every waiter that could have missed that change (see the
    /// module docs). A failure is only logged: the waiter then wakes by its own
    /// timers.
    async fn wake(&self, name: &str) {
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&self.table.as_str(), Type::TEXT)];
        if let Err(failed) = self.db.query("wake", &self.sql.wake, &params, by).await {
            tracing::debug!(lock = name, error = %failed.error, "fencelock: postgres: waking the next waiter failed");
        }
    }

    /// Tells the observers of `name` that its holder or value changed. Run
    /// after the change committed; a failure is only logged (observers then
    /// see the change at their next read).
    async fn announce(&self, name: &str) {
        let by = Instant::now() + STATEMENT_TIMEOUT;
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&self.table.as_str(), Type::TEXT)];
        if let Err(failed) = self.db.query("announce", &self.sql.announce, &params, by).await {
            tracing::debug!(lock = name, error = %failed.error, "fencelock: postgres: announcing a change failed");
        }
    }
}

/// Withdraws a request whose acquire ended without a result (dropped, or
/// failed): spawned on drop while armed.
struct Withdraw {
    store: Arc<Store>,
    name: String,
    owner: String,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let store = self.store.clone();
        let (name, owner) = (std::mem::take(&mut self.name), std::mem::take(&mut self.owner));
        spawn_detached(async move {
            if let Err(e) = store.withdraw(&name, &owner).await {
                tracing::debug!(lock = %name, error = %e, "fencelock: postgres: withdrawing a request failed");
            }
        });
    }
}

/// One grant, as its renewals, its release and its new values need it.
struct Grant {
    store: Arc<Store>,
    name: String,
    owner: String,
    token: u64,
    ttl: Duration,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
    /// A campaign's: its release is announced to observers.
    announced: bool,
}

impl Grant {
    fn token_param(&self) -> i64 {
        // Tokens come from a bigint sequence: always in range.
        i64::try_from(self.token).unwrap_or(i64::MAX)
    }
}

impl TableGrant for Grant {
    fn name(&self) -> &str {
        &self.name
    }

    /// Compare-and-delete; then wakes the next waiter if it released.
    fn release(&self) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let by = Instant::now() + STATEMENT_TIMEOUT;
            let token = self.token_param();
            let params: [(&(dyn ToSql + Sync), Type); 3] =
                [(&self.name, Type::TEXT), (&token, Type::INT8), (&self.owner, Type::TEXT)];
            let rows = self.store.db.query("release", &self.store.sql.release, &params, by).await?;
            let released = column::<i64>(one(&rows, "release")?, 0)? == 1;
            if released {
                self.store.wake(&self.name).await;
                if self.announced {
                    self.store.announce(&self.name).await;
                }
            }
            Ok(released)
        })
    }

    /// Compare-and-set of the holders row, if this grant is still the live
    /// one (see the module docs); then announces it.
    fn set_value(&self, value: Vec<u8>) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let by = Instant::now() + STATEMENT_TIMEOUT;
            let (token, identity) = (self.token_param(), self.identity.as_deref());
            let params: [(&(dyn ToSql + Sync), Type); 5] = [
                (&self.name, Type::TEXT),
                (&token, Type::INT8),
                (&self.owner, Type::TEXT),
                (&identity, Type::TEXT),
                (&value, Type::BYTEA),
            ];
            let rows = self.store.db.query("set value", &self.store.sql.set_value, &params, by).await?;
            if rows.is_empty() {
                return Ok(false);
            }
            self.store.announce(&self.name).await;
            Ok(true)
        })
    }
}

impl Renew for Grant {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let token = self.token_param();
            let ttl_us = micros(self.ttl);
            let params: [(&(dyn ToSql + Sync), Type); 4] =
                [(&self.name, Type::TEXT), (&token, Type::INT8), (&self.owner, Type::TEXT), (&ttl_us, Type::INT8)];
            let rows = self.store.db.query("renew", &self.store.sql.renew, &params, round_end).await?;
            Ok(if rows.is_empty() { Renewed::Gone } else { Renewed::Confirmed(Some(self.ttl)) })
        })
    }
}

/// A lease-table grant as its guard holds it: renewed by the watchdog
/// ([`Renew`]), released and changed through the guard. The exclusive
/// [`Grant`] and the shared one (module `shared`) are both held by a
/// [`LeaseHeld`].
trait TableGrant: Renew {
    fn name(&self) -> &str;

    /// Releases it if it still holds the lock (then wakes the next waiter):
    /// [`Held::release`].
    fn release(&self) -> BoxFuture<'_, Result<bool, Error>>;

    /// [`Held::set_value`] of it.
    fn set_value(&self, value: Vec<u8>) -> BoxFuture<'_, Result<bool, Error>>;

    /// [`Held::downgrade`] of it (`None`, the default: no read-write lock).
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        None
    }
}

/// The guard of `grant`, token `token` of `name`, confirmed with `ttl` by a
/// statement sent at `sent`: the watchdog keeps it from now on.
fn lease_guard<G: TableGrant>(name: &str, token: u64, ttl: Duration, sent: Instant, grant: Arc<G>) -> Guard {
    let kept = KeptLease::start(token, ttl, sent, grant.clone());
    let watch = kept.watch();
    Guard::new(name.to_string(), Some(token), "postgres", watch, Box::new(LeaseHeld { kept, grant }))
}

/// The `Held` part of a lease-table guard: the watchdog, and the grant.
struct LeaseHeld<G> {
    kept: KeptLease,
    grant: Arc<G>,
}

impl<G: TableGrant> Held for LeaseHeld<G> {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let released = self.grant.release().await;
            drop(self.kept); // renews until the release is answered
            released
        })
    }

    fn release_in_background(self: Box<Self>) {
        let name = self.grant.name().to_string();
        spawn_detached(async move {
            if let Err(e) = self.release().await {
                tracing::debug!(lock = %name, error = %e, "fencelock: postgres: background release failed");
            }
        });
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(self.grant.set_value(value))
    }

    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        self.grant.downgrade()
    }
}

/// The statements, with the table name spliced in (see the module docs).
struct Sql {
    attempt: String,
    enqueue: String,
    withdraw: String,
    wake: String,
    renew: String,
    release: String,
    check: String,
    set_value: String,
    leader: String,
    announce: String,
    shared: shared::SharedSql,
}

/// `x - clock_timestamp()` in whole microseconds (rounded up, at least 0).
fn left_us(x: &str) -> String {
    format!("greatest(0, ceil(extract(epoch FROM {x} - clock_timestamp()) * 1000000))::bigint")
}

impl Sql {
    fn new(table: &str) -> Sql {
        let locks = format!("\"{table}\"");
        let waiters = format!("\"{table}_waiters\"");
        let holders = format!("\"{table}_holders\"");
        let shared = format!("\"{table}_shared\"");
        let seq = format!("'\"{table}_token_seq\"'");
        let expiry = "clock_timestamp() + $3 * interval '1 microsecond'";
        let attempt = format!(
            "WITH ahead AS (\
                SELECT count(*) AS n, min(expires_at) AS first_expiry FROM {waiters} \
                WHERE name = $1 AND id < $4 AND expires_at > clock_timestamp()\
            ), cur AS (\
                SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() AS held, expires_at, shared_until \
                FROM {locks} WHERE name = $1\
            ), created AS (\
                INSERT INTO {locks} (name, token, owner, expires_at) \
                SELECT $1, nextval({seq}), $2, {expiry} \
                WHERE NOT EXISTS (SELECT 1 FROM cur) AND (SELECT n FROM ahead) = 0 \
                ON CONFLICT (name) DO NOTHING RETURNING token\
            ), taken AS (\
                UPDATE {locks} SET token = nextval({seq}), owner = $2, expires_at = {expiry} \
                WHERE name = $1 AND ((owner IS NULL OR expires_at <= clock_timestamp()) AND (SELECT n FROM ahead) = 0 \
                    AND (shared_until IS NULL OR shared_until <= clock_timestamp()) \
                    OR owner = $2 AND expires_at > clock_timestamp()) \
                RETURNING token\
            ), granted AS (\
                SELECT token FROM created UNION ALL SELECT token FROM taken\
            ), described AS (\
                INSERT INTO {holders} (name, token, identity, value) \
                SELECT $1, token, $5, $6 FROM granted WHERE $5 IS NOT NULL OR length($6) > 0 \
                {upsert}\
            ), dequeued AS (\
                DELETE FROM {waiters} WHERE id = $4 AND EXISTS (SELECT 1 FROM granted)\
            ), refreshed AS (\
                UPDATE {waiters} SET expires_at = {expiry} \
                WHERE id = $4 AND expires_at > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM granted) \
                RETURNING id\
            ) \
            SELECT (SELECT token FROM granted), \
                (SELECT token FROM cur WHERE held), \
                (SELECT CASE WHEN held THEN {holder_left} \
                    WHEN shared_until > clock_timestamp() THEN {shared_left} END FROM cur), \
                (SELECT n FROM ahead), \
                (SELECT CASE WHEN n > 0 THEN {ahead_left} END FROM ahead), \
                (SELECT count(*) FROM {waiters} WHERE name = $1 AND expires_at > clock_timestamp()), \
                EXISTS (SELECT 1 FROM refreshed), NULL::int",
            holder_left = left_us("expires_at"),
            shared_left = left_us("shared_until"),
            ahead_left = left_us("first_expiry"),
            upsert = upsert(&holders),
        );
        let enqueue = format!(
            "WITH earlier AS (DELETE FROM {waiters} WHERE name = $1 AND owner = $2) \
             INSERT INTO {waiters} (name, owner, expires_at, kind, weight, permits) \
             VALUES ($1, $2, {expiry}, $4, $5, $6) RETURNING id"
        );
        let withdraw = format!(
            "WITH gone AS (DELETE FROM {waiters} WHERE name = $1 AND owner = $2 RETURNING id), \
             freed AS (UPDATE {locks} SET owner = NULL, expires_at = NULL WHERE name = $1 AND owner = $2 RETURNING 1), \
             unshared AS (DELETE FROM {shared} WHERE name = $1 AND owner = $2 RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM freed) OR EXISTS (SELECT 1 FROM unshared) OR EXISTS (SELECT 1 FROM gone WHERE NOT EXISTS (\
                 SELECT 1 FROM {waiters} w WHERE w.name = $1 AND w.id < gone.id AND w.expires_at > clock_timestamp()))"
        );
        let wake = format!(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, id::text || ':' || $1) \
             FROM (SELECT min(id) AS id FROM {waiters} WHERE name = $1 AND expires_at > clock_timestamp()) head \
             WHERE id IS NOT NULL"
        );
        let renew = format!(
            "UPDATE {locks} SET expires_at = clock_timestamp() + $4 * interval '1 microsecond' \
             WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1"
        );
        let release = format!(
            "WITH released AS (\
                UPDATE {locks} SET owner = NULL, expires_at = NULL \
                WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1\
            ), swept AS (\
                DELETE FROM {waiters} WHERE name = $1 AND expires_at <= clock_timestamp()\
            ) \
            SELECT count(*) FROM released"
        );
        let check =
            format!("SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() FROM {locks} WHERE name = $1");
        let set_value = format!(
            "WITH mine AS (\
                SELECT name, token FROM {locks} \
                WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() FOR UPDATE\
            ) \
            INSERT INTO {holders} (name, token, identity, value) SELECT name, token, $4, $5 FROM mine \
            {upsert} RETURNING 1",
            upsert = upsert(&holders),
        );
        let leader = format!(
            "SELECT l.token, h.identity, h.value, {left} \
             FROM {locks} l LEFT JOIN {holders} h ON h.name = l.name AND h.token = l.token \
             WHERE l.name = $1 AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()",
            left = left_us("l.expires_at"),
        );
        let announce = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, '0:' || $1)".to_string();
        let shared = shared::SharedSql::new(table);
        Sql { attempt, enqueue, withdraw, wake, renew, release, check, set_value, leader, announce, shared }
    }
}

/// The upsert of a holders row: a row of an older grant is replaced, never
/// one of a newer grant.
fn upsert(holders: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, identity = EXCLUDED.identity, \
         value = EXCLUDED.value WHERE {holders}.token <= EXCLUDED.token"
    )
}

/// The DDL of the module docs, for `table`.
fn schema_sql(table: &str) -> String {
    format!(
        "BEGIN; \
         SELECT pg_advisory_xact_lock(1718382435, hashtext('{table}')); \
         CREATE TABLE IF NOT EXISTS \"{table}\" (\
             name text PRIMARY KEY, token bigint, owner text, expires_at timestamptz); \
         CREATE SEQUENCE IF NOT EXISTS \"{table}_token_seq\" AS bigint; \
         CREATE TABLE IF NOT EXISTS \"{table}_waiters\" (\
             id bigserial PRIMARY KEY, name text NOT NULL, owner text NOT NULL, expires_at timestamptz NOT NULL); \
         CREATE INDEX IF NOT EXISTS \"{table}_waiters_name\" ON \"{table}_waiters\" (name, id); \
         CREATE TABLE IF NOT EXISTS \"{table}_holders\" (\
             name text PRIMARY KEY, token bigint NOT NULL, identity text, value bytea NOT NULL); \
         {shared} \
         COMMIT",
        shared = shared::schema_sql(table),
    )
}

/// Creates the schema unless all of it exists already.
async fn ensure_schema(db: &Db, table: &str) -> Result<(), Error> {
    let by = Instant::now() + STATEMENT_TIMEOUT;
    let names = ["", "_token_seq", "_waiters", "_holders", "_shared"].map(|suffix| format!("\"{table}{suffix}\""));
    let [a, b, c, d, e] = &names;
    // The shared table comes with the functions, in the same transaction.
    let sql = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL \
               AND to_regclass($4) IS NOT NULL AND to_regclass($5) IS NOT NULL";
    let params: [(&(dyn ToSql + Sync), Type); 5] =
        [(a, Type::TEXT), (b, Type::TEXT), (c, Type::TEXT), (d, Type::TEXT), (e, Type::TEXT)];
    let rows = db.query("schema check", sql, &params, by).await?;
    if column::<bool>(one(&rows, "schema check")?, 0)? {
        return Ok(());
    }
    let conn = db.conn(by).await?;
    if let Err(e) = bounded("creating the schema", by, conn.client.batch_execute(&schema_sql(table))).await {
        // Leave the shared connection outside the failed transaction.
        let _ = bounded("rollback", by, conn.client.batch_execute("ROLLBACK")).await;
        return Err(e);
    }
    Ok(())
}

/// The statement connection: opened at connect, reopened on the next statement
/// after it dropped (or stalled: see [`STALL`]).
struct Db {
    config: Config,
    current: Mutex<Option<Arc<Conn>>>,
    /// Serialises reopening, so that concurrent statements open one connection.
    opening: tokio::sync::Mutex<()>,
}

struct Conn {
    client: Client,
    driver: JoinHandle<()>,
}

impl Db {
    async fn connect(config: Config) -> Result<Db, Error> {
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
    async fn conn(&self, by: Instant) -> Result<Arc<Conn>, Failed> {
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let no_time = || Failed::transient("postgres: reconnecting: no connection in time".into());
        let _opening = tokio::time::timeout_at(by, self.opening.lock()).await.map_err(|_| no_time())?;
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let conn = match tokio::time::timeout_at(by, Conn::open(&self.config)).await {
            Ok(Ok(conn)) => Arc::new(conn),
            Ok(Err(e)) => return Err(Failed::transient(format!("postgres: reconnecting: {e}"))),
            Err(_) => return Err(no_time()),
        };
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Runs one statement by `by`. A statement that went unanswered for
    /// [`STALL`] retires its connection (the next statement reconnects).
    async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        by: Instant,
    ) -> Result<Vec<Row>, Failed> {
        let conn = self.conn(by).await?;
        let sent = Instant::now();
        match tokio::time::timeout_at(by, conn.client.query_typed(sql, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(Failed { transient: is_transient(&e), error: backend_error(what, e) }),
            Err(_) => {
                if sent.elapsed() >= STALL {
                    self.retire(&conn);
                }
                Err(Failed::transient(format!("postgres: {what}: no answer in time")))
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
        let limit = config.get_connect_timeout().copied().unwrap_or(super::CONNECT_TIMEOUT);
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
struct Failed {
    error: Error,
    transient: bool,
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

/// `d` in whole microseconds, rounded up (so the database never keeps a lock
/// for less than the client counts on).
fn micros(d: Duration) -> i64 {
    let us = d.as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// A request's weight as a statement parameter (1 outside a semaphore).
fn weight_param(opts: &LockOptions) -> i32 {
    i32::try_from(opts.weight.max(1)).unwrap_or(i32::MAX)
}

/// A request's semaphore size as a statement parameter (0: none).
fn permits_param(opts: &LockOptions) -> i32 {
    i32::try_from(opts.permits).unwrap_or(i32::MAX)
}

/// The only row of an answer that always has one.
fn one<'r>(rows: &'r [Row], what: &str) -> Result<&'r Row, Error> {
    rows.first().ok_or_else(|| Error::backend("postgres", format!("{what}: no row in the answer")))
}

/// Column `i` of `row`, or [`Error::Backend`] if it is not what the statement
/// returns.
fn column<'r, T: FromSql<'r>>(row: &'r Row, i: usize) -> Result<T, Error> {
    row.try_get(i).map_err(|e| Error::backend("postgres", format!("unexpected column {i} in the answer: {e}")))
}

/// A token from the sequence (bigint, starts at 1).
fn to_token(t: i64) -> Result<u64, Error> {
    u64::try_from(t).map_err(|_| Error::backend("postgres", format!("negative token {t} in the lock table")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> Seen {
        Seen {
            granted: None,
            holder_token: None,
            holder_left: None,
            ahead: 0,
            ahead_left: None,
            waiters: 0,
            queued: true,
            mismatch: None,
        }
    }

    #[test]
    fn a_waiter_wakes_when_what_blocks_it_can_change() {
        let ms = Duration::from_millis;
        let held = Seen { holder_token: Some(4), holder_left: Some(ms(300)), ..seen() };
        assert_eq!(held.next_change(), Some(ms(300)), "nobody ahead: the holder's expiry");
        let behind = Seen { ahead: 2, ahead_left: Some(ms(900)), ..held.clone() };
        assert_eq!(behind.next_change(), Some(ms(900)), "waiters ahead: the first of their expiries");
        assert_eq!(seen().next_change(), Some(Duration::ZERO), "free and not granted: a race, look again");
        let shared = Seen { holder_left: Some(ms(700)), ..seen() };
        assert_eq!(shared.next_change(), Some(ms(700)), "shared holders: when they may have expired");
    }

    #[test]
    fn a_busy_try_reports_the_holder_and_the_queue() {
        let held = Seen { holder_token: Some(4), holder_left: Some(Duration::from_secs(1)), waiters: 3, ..seen() };
        let got = held.busy();
        assert!(matches!(
            got,
            Acquire::Busy { holder_lease: Some(4), holder_token: Some(4), reopens_in: None, waiters: 3 }
        ));
    }

    #[test]
    fn ttls_round_up_to_the_microsecond() {
        assert_eq!(micros(Duration::from_millis(100)), 100_000);
        assert_eq!(micros(Duration::from_nanos(100_000_001)), 100_001);
        assert_eq!(micros(Duration::from_secs(3600)), 3_600_000_000);
    }

    #[test]
    fn the_table_name_is_the_only_thing_spliced_in() {
        let sql = Sql::new("t_1");
        for stmt in [
            &sql.attempt,
            &sql.enqueue,
            &sql.withdraw,
            &sql.wake,
            &sql.renew,
            &sql.release,
            &sql.check,
            &sql.set_value,
            &sql.leader,
        ] {
            assert!(stmt.contains("\"t_1"), "{stmt}");
            assert!(!stmt.contains("fencelock_locks"), "{stmt}");
        }
        assert!(sql.attempt.contains("nextval('\"t_1_token_seq\"')"));
        assert!(sql.shared.attempt.contains("\"t_1_share\"(") && sql.shared.tokens.contains("\"t_1_shared\""));
        assert!(shared::schema_sql("t_1").contains("nextval('\"t_1_token_seq\"')"));
    }
}
