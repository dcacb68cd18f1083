//! Waking the waiters of the lease-table mode: one listening connection per
//! [`super::PgBackend`], and a registry of the local waiters it wakes.
//!
//! Where it sits: [`super::lease`] registers each acquire here before its first
//! attempt ([`Wakers::register`]) and sleeps on [`Registration::notified`]
//! between attempts. After a statement frees a lock (or the first waiter leaves
//! the queue) has committed, the client that ran it sends
//! `pg_notify(<table>, '<id>:<lock name>')` for the oldest live waiter, if
//! any. Every listening connection of the table receives it; the listener
//! wakes the local waiter with that id, and any local waiter of that name that
//! is still enqueueing (it has no id yet, and may be the one named). Other
//! waiters sleep on. An election's observers register without an id too, so
//! every notification of the name wakes them, among them the announcements
//! `'0:<lock name>'` of a campaign's grant or release or a new value (see
//! `lease/election.rs`).
//!
//! A registered waiter misses no wake-up: it registers before its first
//! attempt, a lock freed before an attempt is seen by that attempt, and one
//! freed after it is followed by a notification (a wake-up that arrives during
//! an attempt is kept for the next sleep). If the listening connection drops,
//! notifications sent meanwhile are lost: the listener reconnects (with
//! backoff), and then wakes every local waiter once so that each looks again.
//! Until then waiters fall back on their own timers (the holder's expiry, and
//! the refresh of their queue entry every TTL/3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client};

use super::tls::PgConfig as Config;

use super::{describe, AbortOnDrop, OpenFailed};
use crate::backoff::Backoff;
use crate::error::Error;

/// A waiter's id before its queue entry exists.
const NO_ID: i64 = 0;

/// The local waiters of one backend, by lock name.
#[derive(Debug, Default)]
pub(super) struct Wakers {
    slots: Mutex<HashMap<String, Vec<Arc<Slot>>>>,
}

#[derive(Debug)]
struct Slot {
    /// The waiter's queue id, or [`NO_ID`].
    id: AtomicI64,
    /// Keeps one wake-up if none is awaited at the time.
    notify: Notify,
}

/// One waiting acquire, registered until dropped.
#[derive(Debug)]
pub(super) struct Registration {
    wakers: Arc<Wakers>,
    name: String,
    slot: Arc<Slot>,
}

impl Wakers {
    pub fn new() -> Arc<Wakers> {
        Arc::new(Wakers::default())
    }

    /// Registers a waiter on `name` (without a queue id yet).
    pub fn register(self: &Arc<Self>, name: &str) -> Registration {
        let slot = Arc::new(Slot { id: AtomicI64::new(NO_ID), notify: Notify::new() });
        self.lock().entry(name.to_string()).or_default().push(slot.clone());
        Registration { wakers: self.clone(), name: name.to_string(), slot }
    }

    /// Handles one notification payload, `<id>:<name>` (see the module docs).
    /// A payload of another shape is ignored.
    pub fn dispatch(&self, payload: &str) {
        let Some((id, name)) = payload.split_once(':') else {
            return;
        };
        let Ok(target) = id.parse::<i64>() else {
            return;
        };
        if let Some(slots) = self.lock().get(name) {
            for slot in slots {
                let id = slot.id.load(Ordering::SeqCst);
                if id == target || id == NO_ID {
                    slot.notify.notify_one();
                }
            }
        }
    }

    /// Wakes every local waiter (after notifications may have been lost).
    pub fn wake_all(&self) {
        for slot in self.lock().values().flatten() {
            slot.notify.notify_one();
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Arc<Slot>>>> {
        // A panic elsewhere cannot leave the map half-updated: recover it.
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Registration {
    /// Records the waiter's queue id (after it enqueued, or re-enqueued).
    pub fn set_id(&self, id: i64) {
        self.slot.id.store(id, Ordering::SeqCst);
    }

    /// Resolves at the next wake-up (at once if one came since the last).
    pub async fn notified(&self) {
        self.slot.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut slots = self.wakers.lock();
        if let Some(list) = slots.get_mut(&self.name) {
            list.retain(|s| !Arc::ptr_eq(s, &self.slot));
            if list.is_empty() {
                slots.remove(&self.name);
            }
        }
    }
}

/// Opens the listening connection (an error is [`Error::Connect`]: this runs
/// at connect) and spawns the task that keeps it, reconnecting when it drops.
/// The task ends when the returned handle is dropped.
pub(super) async fn start(config: Config, channel: String, wakers: Arc<Wakers>) -> Result<AbortOnDrop, Error> {
    let first = Listener::open(&config, &channel, &wakers).await.map_err(|e| e.connect("listening connection: "))?;
    Ok(AbortOnDrop(tokio::spawn(keep_listening(config, channel, wakers, first))))
}

/// One listening connection: the client (kept so that the connection stays
/// open) and the task that drives it and dispatches its notifications.
struct Listener {
    _client: Client,
    driver: AbortOnDrop,
}

impl Listener {
    async fn open(config: &Config, channel: &str, wakers: &Arc<Wakers>) -> Result<Listener, OpenFailed> {
        let limit = config.get_connect_timeout().copied().unwrap_or(super::CONNECT_TIMEOUT);
        let (client, mut connection) = match tokio::time::timeout(limit, config.connect()).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(OpenFailed::by(e)),
            Err(_) => return Err(OpenFailed::no_answer("", limit)),
        };
        let wakers = wakers.clone();
        let driver = AbortOnDrop(tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => wakers.dispatch(n.payload()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::debug!(error = %describe(&e), "fencelock: postgres listening connection ended");
                        return;
                    }
                    None => return,
                }
            }
        }));
        // The channel is a checked identifier (see `check_table`).
        match tokio::time::timeout(limit, client.batch_execute(&format!("LISTEN \"{channel}\""))).await {
            Ok(Ok(())) => Ok(Listener { _client: client, driver }),
            Ok(Err(e)) => Err(OpenFailed::by(e)),
            Err(_) => Err(OpenFailed::no_answer(" to LISTEN", limit)),
        }
    }

    /// Resolves when the connection has ended.
    async fn ended(&mut self) {
        let _ = (&mut self.driver.0).await;
    }
}

/// Keeps a listening connection open for as long as the task lives; after a
/// reconnection, wakes every local waiter.
async fn keep_listening(config: Config, channel: String, wakers: Arc<Wakers>, first: Listener) {
    let backoff = Backoff::default();
    let mut current = first;
    loop {
        current.ended().await;
        let mut failures = 0u32;
        current = loop {
            tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
            match Listener::open(&config, &channel, &wakers).await {
                Ok(listener) => break listener,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(error = %e, failures, "fencelock: postgres listening connection: reconnect failed");
                }
            }
        };
        wakers.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many wake-ups each registration has pending (0 or 1).
    async fn pending(regs: &[&Registration]) -> Vec<usize> {
        let mut out = Vec::new();
        for r in regs {
            let woke = tokio::time::timeout(std::time::Duration::ZERO, r.notified()).await.is_ok();
            out.push(usize::from(woke));
        }
        out
    }

    #[tokio::test]
    async fn a_notification_wakes_only_the_named_waiter() {
        let wakers = Wakers::new();
        let (a, b, other) = (wakers.register("job"), wakers.register("job"), wakers.register("other"));
        a.set_id(7);
        b.set_id(9);
        other.set_id(8);
        wakers.dispatch("9:job");
        assert_eq!(pending(&[&a, &b, &other]).await, vec![0, 1, 0]);
        wakers.dispatch("8:job");
        assert_eq!(pending(&[&a, &b, &other]).await, vec![0, 0, 0], "id 8 waits on another lock");
        let enqueueing = wakers.register("job");
        wakers.dispatch("7:job");
        assert_eq!(pending(&[&a, &b, &enqueueing]).await, vec![1, 0, 1], "a waiter without an id yet looks too");
        for junk in ["", "job", "x:job", ":job", "7:nobody"] {
            wakers.dispatch(junk);
        }
        assert_eq!(pending(&[&a, &b, &other, &enqueueing]).await, vec![0, 0, 0, 0]);
        wakers.wake_all();
        assert_eq!(pending(&[&a, &b, &other, &enqueueing]).await, vec![1, 1, 1, 1]);
    }

    #[tokio::test]
    async fn a_dropped_registration_leaves_the_registry() {
        let wakers = Wakers::new();
        let a = wakers.register("job");
        let b = wakers.register("job");
        drop(a);
        assert_eq!(wakers.lock().get("job").map(Vec::len), Some(1));
        drop(b);
        assert!(wakers.lock().is_empty());
    }

    #[tokio::test]
    async fn names_with_colons_are_kept_whole() {
        let wakers = Wakers::new();
        let r = wakers.register("a:b");
        r.set_id(3);
        wakers.dispatch("3:a:b");
        assert_eq!(pending(&[&r]).await, vec![1]);
    }
}
