//! The held lock: a grant as its guard holds it ([`TableGrant`]), renewed by
//! the [`KeptLease`] watchdog, released and given new values through the
//! guard; the exclusive [`Grant`] here, the shared one in `shared`.
//!
//! Where it sits: under [`super::recipe`], which makes the guard of a grant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};

use super::store::{column, micros, one};
use super::{spawn_detached, Store, STATEMENT_TIMEOUT};
use crate::backend::{BoxFuture, Guard, Held, KeptLease, Renew, Renewed};
use crate::error::Error;

/// One grant, as its renewals, its release and its new values need it.
pub(super) struct Grant {
    pub(super) store: Arc<Store>,
    pub(super) name: String,
    pub(super) owner: String,
    pub(super) token: u64,
    pub(super) ttl: Duration,
    /// The request's identity, stored again with each new value.
    pub(super) identity: Option<String>,
    /// A campaign's: its release is announced to observers.
    pub(super) announced: bool,
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
            let by = crate::clock::now() + STATEMENT_TIMEOUT;
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
            let by = crate::clock::now() + STATEMENT_TIMEOUT;
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
pub(super) trait TableGrant: Renew {
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
pub(super) fn lease_guard<G: TableGrant>(name: &str, token: u64, ttl: Duration, sent: Instant, grant: Arc<G>) -> Guard {
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
