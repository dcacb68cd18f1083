//! The recipe (see the [module docs](super)): a lease and a key under the
//! lock's prefix, the owner the key with the lowest create revision, a
//! waiter watching its predecessor only and looking again after it goes; a
//! request that is not granted is withdrawn (its lease revoked).
//!
//! A waiter does not trust a silent watch for long: after [`RECHECK`] (or a
//! third of its lease's TTL, if less) without news it watches and reads its
//! predecessor again; and a call of the wait that does not reach etcd (a
//! restart of etcd, a reset connection) is repeated, with backoff, rather
//! than ending the wait: the waiter's key and lease outlive such a failure.
//! The wait ends when it is granted, when the caller's wait runs out, when
//! its lease is lost (the watchdog decides that), or on an error etcd (or
//! the recipe) gave.
//!
//! Where it sits: under [`super::EtcdBackend`]'s acquire and campaign; the
//! calls are in [`super::rpc`], the guard of a grant in [`super::held`].

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::etcd::mvccpb::KeyValue;

use super::held::{EtcdHeld, Mine};
use super::keys::{key_of, mismatch, Kind};
use super::rpc::{is_unreachable, Etcd, Woken};
use super::EtcdBackend;
use crate::backend::election::encode_holder;
use crate::backend::{Guard, KeptLease, LockBackend, Outcome};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::lease::LeaseWatch;
use crate::types::LockOptions;

/// The longest a waiter trusts a watch that brings no news: then it watches
/// its predecessor anew and reads it again (the interval is this or a third
/// of the waiter's lease TTL, whichever is smaller: [`recheck_interval`]).
/// A watch can go silent without failing: when etcd is killed and restarted,
/// a connection whose reset does not reach the client (through a proxy, a
/// partition, a host that died) keeps the stream open until HTTP/2
/// keep-alive gives up (5 s and 3 s more), the new etcd never knew the
/// watcher, and a deletion made while the stream was dead is never sent
/// again (the watch starts from "now", not from a revision). So a lost
/// wake-up delays a grant by at most this much, rather than until the wait
/// runs out. One second costs a waiter a watch and a read per second; a
/// third of the TTL matches its renewals' cadence, so a short lease's waiter
/// wastes no more of its lease than a renewal round.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

/// The re-check interval of a waiter whose lease has `ttl`: [`RECHECK`], or
/// a third of `ttl` if that is smaller.
pub(super) fn recheck_interval(ttl: Duration) -> Duration {
    RECHECK.min(ttl / 3)
}

impl EtcdBackend {
    /// Queues a request for lock `name` (steps 1 and 2 of the recipe) and
    /// takes its turn (steps 3 to 5), for a lock or a campaign (`purpose`).
    pub(super) async fn acquire_lock(
        &self,
        name: &str,
        opts: &LockOptions,
        purpose: Purpose,
    ) -> Result<Outcome<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        let kind = Kind::of_request(opts);
        if purpose == Purpose::Campaign && kind != Kind::Writer {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let lock = self.lock_prefix(name);
        let wait_end = crate::clock::now() + opts.wait;
        let sent = crate::clock::now();
        let granted = self.etcd.lease_grant(ttl_secs(opts.ttl), self.etcd.deadline()).await?;
        let (lease_id, ttl) = (granted.id, granted.ttl);
        let recheck = recheck_interval(Duration::from_secs(ttl as u64));
        let withdraw = Withdraw { etcd: self.etcd.clone(), lease_id, armed: true };
        let mut key = key_of(&lock, lease_id);
        key.extend_from_slice(kind.suffix().as_bytes());
        let rev = self.etcd.create(&key, encode_holder(opts), lease_id, self.etcd.deadline()).await?;
        let mine = Mine { etcd: self.etcd.clone(), lease_id, key, rev };
        let kept = KeptLease::start(lease_id as u64, Duration::from_secs(ttl as u64), sent, Arc::new(mine.clone()));
        kept.seen_term(granted.term);
        let turn = if kind != Kind::Writer && opts.wait.is_zero() {
            self.shared_turn(&lock, &mine, kind, None, purpose).await?
        } else if opts.wait.is_zero() {
            self.try_turn(&lock, &mine, purpose).await?
        } else {
            let wait = self.wait_turn(&lock, &mine, kind, kept.watch(), purpose, recheck);
            match tokio::time::timeout_at(wait_end, wait).await {
                Ok(turn) => turn?,
                Err(_) => Turn::TimedOut,
            }
        };
        match turn {
            Turn::Granted => {
                withdraw.disarm();
                let watch = kept.watch();
                let token = Some(mine.rev as u64);
                let held = EtcdHeld { mine, identity: opts.identity.clone(), _kept: kept };
                Ok(Outcome::Acquired(Guard::new(name.to_string(), token, self.kind(), watch, Box::new(held))))
            }
            Turn::Busy { owner, keys } => {
                drop(kept);
                withdraw.now().await;
                Ok(Outcome::Busy {
                    holder_lease: Some(owner.lease as u64),
                    holder_token: Some(owner.create_revision as u64),
                    reopens_in: None,
                    // Every key but the owner's and this one (gone now).
                    waiters: u32::try_from(keys.saturating_sub(2).max(0)).unwrap_or(u32::MAX),
                })
            }
            Turn::TimedOut => {
                drop(kept);
                withdraw.now().await;
                Ok(Outcome::TimedOut)
            }
        }
    }

    /// Step 3, once: granted if `mine` is the owner of `lock`, else busy.
    pub(super) async fn try_turn(&self, lock: &[u8], mine: &Mine, purpose: Purpose) -> Result<Turn, Error> {
        let (owner, keys) = self.other_owner(lock, mine, purpose).await?;
        match owner {
            None => Ok(Turn::Granted),
            Some(owner) => Ok(Turn::Busy { owner, keys }),
        }
    }

    /// Steps 3 and 4 until `mine` owns `lock`, looking again at least every
    /// `recheck` (see [`RECHECK`]). A failure to reach etcd, or a connection
    /// given up by another call (a renewal's, say) while this one waits on
    /// it, starts over on the next connection, with backoff (at most
    /// `recheck` apart); the caller bounds the whole wait. Fails if the lease
    /// is lost (see `lease`), the key is gone meanwhile, or etcd answers an
    /// error.
    pub(super) async fn wait_turn(
        &self,
        lock: &[u8],
        mine: &Mine,
        kind: Kind,
        lease: LeaseWatch,
        purpose: Purpose,
        recheck: Duration,
    ) -> Result<Turn, Error> {
        let turn = async {
            let backoff = Backoff { max: recheck, ..Backoff::default() };
            let mut failures = 0u32;
            loop {
                let attempt = self.etcd.on_current(async {
                    match kind {
                        Kind::Writer => self.writer_turn(lock, mine, purpose, recheck).await,
                        _ => self.shared_turn(lock, mine, kind, Some(recheck), purpose).await,
                    }
                });
                match attempt.await {
                    Err(error) if is_unreachable(&error) => {
                        let lease = mine.lease_id;
                        tracing::debug!(lease, failures, %error, "fencelock: etcd: waiting: no answer; looking again");
                        tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
                        failures = failures.saturating_add(1);
                    }
                    other => return other,
                }
            }
        };
        let own_key_gone = async {
            match purpose {
                Purpose::Lock => std::future::pending().await,
                Purpose::Campaign => self.own_key_gone(mine, recheck).await,
            }
        };
        tokio::select! {
            biased;
            reason = lease.lost() => Err(purpose.lost(format!("lost the lease {} while waiting: {reason}", mine.lease_id))),
            () = own_key_gone => Err(purpose.lost(format!(
                "the key of a waiting campaign (lease {}) was deleted: its lease was revoked or expired",
                mine.lease_id
            ))),
            turn = turn => turn,
        }
    }

    /// Steps 3 and 4 of a writer until `mine` owns `lock`: the owner, else
    /// a wait until the predecessor is gone, and again.
    async fn writer_turn(&self, lock: &[u8], mine: &Mine, purpose: Purpose, recheck: Duration) -> Result<Turn, Error> {
        loop {
            if self.other_owner(lock, mine, purpose).await?.0.is_none() {
                return Ok(Turn::Granted);
            }
            let end = self.etcd.deadline();
            if let Some(predecessor) = self.etcd.last_created_before(lock, mine.rev, end).await? {
                self.wait_gone(&predecessor, recheck).await?;
            }
        }
    }

    /// Resolves once `mine`'s key is gone: a campaign's notice, at once, that
    /// its lease was revoked or expired (which deletes the key). A failure to
    /// reach etcd is retried after `recheck`; any other failure leaves the
    /// notice to the next renewal: it never resolves then.
    pub(super) async fn own_key_gone(&self, mine: &Mine, recheck: Duration) {
        let own = KeyValue { key: mine.key.clone(), create_revision: mine.rev, ..KeyValue::default() };
        loop {
            match self.wait_gone(&own, recheck).await {
                Ok(()) => return,
                Err(e) if is_unreachable(&e) => tokio::time::sleep(recheck).await,
                Err(_) => return std::future::pending().await,
            }
        }
    }

    /// The owner of `lock` (the key with the lowest create revision), or `None`
    /// if it is `mine`; with the number of keys of the lock. Fails if `mine` is
    /// not among them any more.
    pub(super) async fn other_owner(
        &self,
        lock: &[u8],
        mine: &Mine,
        purpose: Purpose,
    ) -> Result<(Option<KeyValue>, i64), Error> {
        let (first, keys) = self.etcd.first_created(lock, self.etcd.deadline()).await?;
        if let Some(Kind::Permits { of, .. }) = first.as_ref().map(|kv| Kind::of_key(lock, &kv.key)) {
            return Err(mismatch(of, 0));
        }
        match first {
            Some(kv) if kv.create_revision == mine.rev => Ok((None, keys)),
            Some(kv) if kv.create_revision < mine.rev => Ok((Some(kv), keys)),
            _ => Err(purpose.lost(format!("the key of a waiting acquire (lease {}) was deleted", mine.lease_id))),
        }
    }

    /// Waits until `predecessor` (its key, as of its create revision) is
    /// gone. Each round starts a watcher on its key from now, then reads the
    /// key: the watcher is confirmed before the read, so a deletion after the
    /// read (or the earlier one that found the predecessor) is either seen by
    /// the read or sent to the watcher. Then it waits for the deletion for at
    /// most `recheck`; a watch that stays silent that long, or is canceled,
    /// starts the next round on a new stream (see [`RECHECK`]).
    pub(super) async fn wait_gone(&self, predecessor: &KeyValue, recheck: Duration) -> Result<(), Error> {
        loop {
            let mut watcher = self.etcd.watch_deletion(&predecessor.key, self.etcd.deadline()).await?;
            match self.etcd.get(&predecessor.key, self.etcd.deadline()).await? {
                Some(kv) if kv.create_revision == predecessor.create_revision => {}
                _ => return Ok(()),
            }
            if self.etcd.deleted(&mut watcher, crate::clock::now() + recheck).await? == Woken::Deleted {
                return Ok(());
            }
        }
    }
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A lock: the acquire fails ([`Error::Backend`]).
    Lock,
    /// A campaign: a candidate whose lease ended is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

impl Purpose {
    /// The error of a request that lost its lease or key while waiting.
    pub(super) fn lost(self, why: String) -> Error {
        match self {
            Purpose::Lock => Error::backend("etcd", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("etcd: {why}")),
        }
    }
}

/// Where an acquire's turn ended.
pub(super) enum Turn {
    Granted,
    Busy { owner: KeyValue, keys: i64 },
    TimedOut,
}

/// Withdraws a request that was not granted: revokes its lease, which deletes
/// its key. Armed until granted; if dropped armed (the acquire future was
/// dropped, or failed), the revocation runs in a spawned task.
struct Withdraw {
    etcd: Arc<Etcd>,
    lease_id: i64,
    armed: bool,
}

impl Withdraw {
    /// The request was granted: nothing to withdraw.
    fn disarm(mut self) {
        self.armed = false;
    }

    /// Withdraws now; if that fails, once more in the background.
    async fn now(mut self) {
        match self.etcd.lease_revoke(self.lease_id, self.etcd.deadline()).await {
            Ok(()) => self.armed = false,
            Err(e) => {
                tracing::debug!(lease = self.lease_id, error = %e, "fencelock: etcd: withdraw failed")
            }
        }
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Without a runtime the lease expires by itself (nobody renews it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (etcd, lease_id) = (self.etcd.clone(), self.lease_id);
            runtime.spawn(async move {
                if let Err(e) = etcd.lease_revoke(lease_id, etcd.deadline()).await {
                    tracing::debug!(lease = lease_id, error = %e, "fencelock: etcd: withdraw failed");
                }
            });
        }
    }
}

/// `ttl` in whole seconds, rounded up.
fn ttl_secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        assert_eq!([ms(100), ms(1000), ms(1001), ms(15_000)].map(ttl_secs), [1, 1, 2, 15]);
    }

    #[test]
    fn a_waiter_looks_again_within_a_second_or_a_third_of_its_ttl() {
        let secs = Duration::from_secs;
        let got = [1, 2, 3, 30].map(|s| recheck_interval(secs(s)));
        assert_eq!(got, [secs(1) / 3, secs(2) / 3, RECHECK, RECHECK]);
    }
}
