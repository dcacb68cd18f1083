//! The held lock: the guard of a grant, its renewal (`renew.lua`, run by the
//! watchdog of [`KeptLease`]) and its release and new value.
//!
//! Where it sits: under [`super::recipe`], which makes a guard for each grant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::keys::millis;
use super::recipe::{Req, RENEW};
use super::{RedisBackend, Retry, Shared};
use crate::backend::election::encode_holder_parts;
use crate::backend::{BoxFuture, Guard, Held, KeptLease, Renew, Renewed};
use crate::error::Error;

impl RedisBackend {
    /// The guard of a grant made by a request sent at `sent`.
    pub(super) fn grant(&self, req: &Req<'_>, token: u64, sent: Instant) -> Guard {
        if req.ticket.is_shared() {
            return self.grant_shared(req, token, sent);
        }
        let (keys, name, ttl) = (&self.shared.keys, req.name, req.opts.ttl);
        let owner = format!("{token}:{}", req.ticket.text);
        let (lock, holder) = (keys.lock(name), keys.holder(name));
        let shared = self.shared.clone();
        let renew = Arc::new(RenewLock { shared, lock, holder, owner: owner.clone(), ttl });
        let kept = KeptLease::start(req.ticket.id, ttl, sent, renew);
        let watch = kept.watch();
        let identity = req.opts.identity.clone();
        let held = RedisHeld { kept, shared: self.shared.clone(), name: name.to_string(), owner, identity };
        Guard::new(name.to_string(), Some(token), "redis", watch, Box::new(held))
    }
}

/// Renews one grant: `PEXPIRE` if the lock still holds `owner`.
struct RenewLock {
    shared: Arc<Shared>,
    lock: String,
    /// Renewed with the lock.
    holder: String,
    owner: String,
    ttl: Duration,
}

impl Renew for RenewLock {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let (lock, holder, owner, ttl_ms) = (&self.lock, &self.holder, &self.owner, millis(self.ttl));
            let n: i64 = self
                .shared
                .conn
                .run(round_end, Retry::Once, |mut c| async move {
                    let mut call = RENEW.prepare_invoke();
                    call.key(lock).key(holder).arg(owner).arg(ttl_ms);
                    call.invoke_async(&mut c).await
                })
                .await?;
            Ok(if n == 1 { Renewed::Confirmed(Some(self.ttl)) } else { Renewed::Gone })
        })
    }
}

/// A held Redis lock: keeps the lease alive while it lives.
struct RedisHeld {
    kept: KeptLease,
    shared: Arc<Shared>,
    /// The lock name.
    name: String,
    owner: String,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
}

impl Held for RedisHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let RedisHeld { kept, shared, name, owner, .. } = *self;
            drop(kept); // stop renewing first
            shared.release(&name, &owner).await
        })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = self.release().await;
            });
        }
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(self.shared.set_value(&self.name, &self.owner, data)))
    }

    /// No downgrade: see `redis/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported("redis cannot downgrade a writer; release and acquire shared".into()))
        }))
    }
}
