//! The leases of one client, shared by TTL.
//!
//! Where it sits: between [`crate::Client`] and [`crate::lease`]. Every acquire
//! checks out a [`LeaseHandle`] for its TTL: the first one grants a lease and
//! starts its watchdog; later ones with the same TTL join it while it is live, so
//! a client sends one keep-alive per TTL, not one per lock. A handle counts as a
//! user until it is dropped (an acquire in flight counts too, so the lease cannot
//! be revoked under it). When the last user goes, the lease lingers (kept alive,
//! holding nothing) for the client's linger time, so that a loop of acquire →
//! release costs two commands, not four; if no acquire joins it meanwhile, the
//! registry stops the watchdog and revokes the lease in the background. Dropping
//! the registry (the last clone of the client) revokes lingering leases at once.
//! A lost lease stays in its slot until the next acquire with that TTL replaces
//! it with a fresh one, and closes it: revoked on the server (unless the server
//! dropped it already), so that its locks do not wait there for its expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::lease_rpc;
use crate::backend::native::rpc::Rpc;
use crate::error::Error;
use crate::lease::{LeaseCell, LeaseLost};
use crate::types::to_ms;

/// The shared leases of one client, by TTL in milliseconds.
#[derive(Debug)]
pub(crate) struct Registry {
    rpc: Rpc,
    /// Where background revokes and releases run when dropped outside a runtime.
    runtime: Handle,
    /// How long a lease with no user is kept before it is revoked.
    linger: Duration,
    slots: Mutex<HashMap<u64, Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Serializes grants for this TTL, so that concurrent first acquires share one
    /// lease. Slots are never removed: one per TTL the client ever used.
    gate: Arc<tokio::sync::Mutex<()>>,
    live: Option<Entry>,
}

#[derive(Debug)]
struct Entry {
    cell: Arc<LeaseCell>,
    users: usize,
    watchdog: JoinHandle<()>,
    /// When `users` last fell to zero.
    idle_since: Instant,
    /// A reaper task is watching this entry.
    reaper: bool,
}

/// One user of a shared lease. Dropping it may close the lease.
#[derive(Debug)]
pub(crate) struct LeaseHandle {
    registry: Arc<Registry>,
    ttl_ms: u64,
    cell: Arc<LeaseCell>,
}

impl LeaseHandle {
    pub fn cell(&self) -> &Arc<LeaseCell> {
        &self.cell
    }

    /// One more user of this same lease (each grant of a multi-lock holds one).
    pub fn another(&self) -> LeaseHandle {
        self.registry.add_user(self.ttl_ms, &self.cell);
        LeaseHandle { registry: self.registry.clone(), ttl_ms: self.ttl_ms, cell: self.cell.clone() }
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.registry.check_in(self.ttl_ms, &self.cell);
    }
}

impl Registry {
    pub fn new(rpc: Rpc, runtime: Handle, linger: Duration) -> Arc<Registry> {
        Arc::new(Registry { rpc, runtime, linger, slots: Mutex::default() })
    }

    pub fn runtime(&self) -> Handle {
        Handle::try_current().unwrap_or_else(|_| self.runtime.clone())
    }

    /// A live lease of `ttl` for one more user, granting one (before `deadline`)
    /// if there is none.
    pub async fn check_out(self: &Arc<Self>, ttl: Duration, deadline: Instant) -> Result<LeaseHandle, Error> {
        let ttl_ms = to_ms(ttl);
        if let Some(h) = self.join(ttl_ms) {
            return Ok(h);
        }
        let gate = self.lock().entry(ttl_ms).or_default().gate.clone();
        let _granting = gate.lock().await;
        if let Some(h) = self.join(ttl_ms) {
            return Ok(h);
        }
        let (cell, sent) = lease_rpc::grant(&self.rpc, ttl, deadline).await?;
        let watchdog = lease_rpc::spawn_watchdog(self.rpc.clone(), cell.clone(), sent);
        let old = self.lock().entry(ttl_ms).or_default().live.replace(Entry {
            cell: cell.clone(),
            users: 1,
            watchdog,
            idle_since: crate::clock::now(),
            reaper: false,
        });
        if let Some(old) = old {
            // It was lost. Its watchdog may be revoking it (to free its locks):
            // closing it revokes it again rather than cutting that short.
            self.close(old);
        }
        Ok(LeaseHandle { registry: self.clone(), ttl_ms, cell })
    }

    /// Joins the live lease of `ttl_ms`, if there is one.
    fn join(self: &Arc<Self>, ttl_ms: u64) -> Option<LeaseHandle> {
        let mut slots = self.lock();
        let entry = slots.get_mut(&ttl_ms)?.live.as_mut()?;
        if entry.cell.is_lost() {
            return None;
        }
        entry.users += 1;
        Some(LeaseHandle { registry: self.clone(), ttl_ms, cell: entry.cell.clone() })
    }

    /// One more user of `cell`, if it is still the live lease of `ttl_ms` (a
    /// lease replaced after a loss counts no users: see `check_in`).
    fn add_user(&self, ttl_ms: u64, cell: &Arc<LeaseCell>) {
        let mut slots = self.lock();
        if let Some(e) = slots.get_mut(&ttl_ms).and_then(|s| s.live.as_mut()).filter(|e| Arc::ptr_eq(&e.cell, cell)) {
            e.users += 1;
        }
    }

    /// One user of `cell` is gone. If it was the last, the lease is closed after
    /// the linger time unless a user joins it meanwhile (at once if lost, or if
    /// the linger is zero).
    fn check_in(self: &Arc<Self>, ttl_ms: u64, cell: &Arc<LeaseCell>) {
        let closed = {
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(&ttl_ms) else { return };
            match &mut slot.live {
                Some(e) if Arc::ptr_eq(&e.cell, cell) => {
                    e.users -= 1;
                    if e.users > 0 {
                        return;
                    }
                    if self.linger.is_zero() || e.cell.is_lost() {
                        slot.live.take()
                    } else {
                        e.idle_since = crate::clock::now();
                        if !e.reaper {
                            e.reaper = true;
                            self.spawn_reaper(ttl_ms, cell.clone());
                        }
                        None
                    }
                }
                // Replaced after a loss: nothing to close.
                _ => None,
            }
        };
        if let Some(entry) = closed {
            self.close(entry);
        }
    }

    /// One task per idle lease (not one per release): it closes the lease once it
    /// has been idle for the linger time, and ends if a user joins it. It does not
    /// keep the registry alive.
    fn spawn_reaper(self: &Arc<Self>, ttl_ms: u64, cell: Arc<LeaseCell>) {
        let (registry, linger) = (Arc::downgrade(self), self.linger);
        let mut until = crate::clock::now() + linger;
        self.runtime().spawn(async move {
            loop {
                tokio::time::sleep_until(until).await;
                let Some(registry) = Weak::upgrade(&registry) else { return };
                let closed = {
                    let mut slots = registry.lock();
                    let Some(slot) = slots.get_mut(&ttl_ms) else { return };
                    match &mut slot.live {
                        Some(e) if Arc::ptr_eq(&e.cell, &cell) => {
                            if e.users > 0 {
                                e.reaper = false;
                                return;
                            }
                            until = e.idle_since + linger;
                            if until > crate::clock::now() {
                                continue; // used and idle again since: wait for the rest
                            }
                            slot.live.take()
                        }
                        _ => return,
                    }
                };
                if let Some(entry) = closed {
                    registry.close(entry);
                }
                return;
            }
        });
    }

    /// Stops the watchdog and revokes the lease unless the server no longer has it.
    fn close(&self, entry: Entry) {
        if let Some(lease) = Self::end(entry) {
            lease_rpc::spawn_revoke(&self.runtime(), self.rpc.clone(), lease);
        }
    }

    /// Stops the watchdog and marks the lease closed: the lease to revoke,
    /// unless the server no longer has it.
    fn end(entry: Entry) -> Option<u64> {
        entry.watchdog.abort();
        let before = entry.cell.state().lost;
        entry.cell.lose(LeaseLost::Closed);
        (!matches!(before, Some(LeaseLost::NotFound | LeaseLost::Revoked))).then_some(entry.cell.id)
    }

    /// Closes every lease that no lock uses (the lingering ones) now, and
    /// waits for the server to revoke each, within the RPC deadline: for a
    /// client about to go away, whose background revokes would die with its
    /// process and leave the leases to live out their TTL. Leases in use are
    /// left alone. A revoke that fails is left to the lease's expiry.
    pub async fn close_idle(&self) {
        let idle: Vec<Entry> = self.lock().values_mut().filter_map(|s| s.live.take_if(|e| e.users == 0)).collect();
        for lease in idle.into_iter().filter_map(Self::end) {
            if let Err(e) = lease_rpc::revoke(&self.rpc, lease).await {
                tracing::debug!(lease, error = %e, "fencelock: revoke at close failed");
            }
        }
    }

    /// Marks a lease of this client lost after it was revoked by
    /// [`crate::Client::revoke_lease`].
    pub fn revoked(&self, lease_id: u64) {
        let slots = self.lock();
        for e in slots.values().filter_map(|s| s.live.as_ref()) {
            if e.cell.id == lease_id {
                e.cell.lose(LeaseLost::Revoked);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        // A panic while holding this lock leaves the map consistent (every
        // critical section is a single update), so poisoning is ignored.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Registry {
    /// The client is gone: revoke the leases that were lingering. (A lease with
    /// users keeps the registry alive, so every entry left here is idle.)
    fn drop(&mut self) {
        let idle: Vec<Entry> = self.lock().values_mut().filter_map(|s| s.live.take()).collect();
        for entry in idle {
            self.close(entry);
        }
    }
}
