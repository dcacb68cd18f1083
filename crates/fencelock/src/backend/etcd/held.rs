//! The held lock: a request's key and its lease ([`Mine`]), renewed by the
//! [`KeptLease`] watchdog (a keep-alive and a read of the key at once), and
//! the guard's release (the lease revoked) and new value.
//!
//! Where it sits: under [`super::recipe`], which makes the guard of a grant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::rpc::Etcd;
use crate::backend::election::encode_holder_parts;
use crate::backend::{BoxFuture, Held, KeptLease, Renew, Renewed};
use crate::error::Error;

/// One acquire's key: what renews it, and what release compares.
#[derive(Clone)]
pub(super) struct Mine {
    pub(super) etcd: Arc<Etcd>,
    pub(super) lease_id: i64,
    pub(super) key: Vec<u8>,
    /// The key's create revision: the token.
    pub(super) rev: i64,
}

impl Renew for Mine {
    /// A keep-alive of the lease and a read of the key, at once: `Gone` if the
    /// lease is (TTL 0) or the key is no longer this acquire's.
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let (ttl, key) =
                tokio::join!(self.etcd.lease_keep_alive(self.lease_id, round_end), self.etcd.get(&self.key, round_end));
            if matches!(key, Ok(ref kv) if kv.as_ref().map(|kv| kv.create_revision) != Some(self.rev)) {
                return Ok(Renewed::Gone);
            }
            let (ttl, term) = ttl?;
            key?;
            if ttl <= 0 {
                return Ok(Renewed::Gone);
            }
            Ok(Renewed::ConfirmedInTerm(Some(Duration::from_secs(ttl as u64)), term))
        })
    }
}

/// A granted lock: the key and the lease keeping it.
pub(super) struct EtcdHeld {
    pub(super) mine: Mine,
    /// The request's identity, stored again with each new value.
    pub(super) identity: Option<String>,
    /// Renews the lease until the release is done (or this is dropped).
    pub(super) _kept: KeptLease,
}

impl EtcdHeld {
    /// Compare-and-delete of the key, then the lease's revocation.
    async fn release_now(self) -> Result<bool, Error> {
        let Mine { etcd, lease_id, key, rev } = &self.mine;
        let released = etcd.delete_if_created_at(key, *rev, etcd.deadline()).await?;
        if let Err(e) = etcd.lease_revoke(*lease_id, etcd.deadline()).await {
            // The lease then expires by itself (the watchdog stops with `self`).
            tracing::debug!(lease = lease_id, error = %e, "fencelock: etcd: revoke after release failed");
        }
        Ok(released)
    }
}

impl Held for EtcdHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(self.release_now())
    }

    /// A key's kind is its name: see `etcd/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported("etcd cannot downgrade a writer; release and acquire shared".into()))
        }))
    }

    /// Compare-and-set of the key: a Put on the same lease if the key is
    /// still the one this acquire created. Observers see it as a Put of the
    /// owner key, the same term with a new value.
    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let Mine { etcd, lease_id, key, rev } = &self.mine;
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(etcd.put_if_created_at(key, *rev, data, *lease_id, etcd.deadline())))
    }

    fn release_in_background(self: Box<Self>) {
        // Without a runtime, dropping `self` stops the renewals: the lease expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let lease = self.mine.lease_id;
                if let Err(e) = self.release_now().await {
                    tracing::debug!(lease, error = %e, "fencelock: etcd: background release failed");
                }
            });
        }
    }
}
