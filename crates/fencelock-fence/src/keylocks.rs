//! Per-key async mutexes: operations on one key run one at a time, while
//! operations on different keys run in parallel. Used by [`crate::FileFence`]
//! (to serialize admits on a key) and by the storage server (to make "admit,
//! then write the object, then log" one step per key).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A map from key to an async mutex, whose entries are removed when nobody
/// holds or waits for them, so it stays as small as the keys in use.
#[derive(Default)]
pub(crate) struct KeyLocks {
    map: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Holds one key's lock; dropping it releases the key.
pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Wait for, and take, the lock of `key`.
    pub(crate) async fn lock(&self, key: &str) -> KeyGuard<'_> {
        let mutex = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.to_owned()).or_default().clone()
        };
        let guard = mutex.lock_owned().await;
        KeyGuard { locks: self, key: key.to_owned(), guard: Some(guard) }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        // Release first, then drop the entry if the map's is the last handle
        // (no holder, no waiter: a waiter holds a clone of the Arc).
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&self.key).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_are_removed_when_unused() {
        let locks = KeyLocks::default();
        {
            let _a = locks.lock("a").await;
            let _b = locks.lock("b").await;
            assert_eq!(locks.len(), 2);
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn one_key_is_exclusive() {
        let locks = Arc::new(KeyLocks::default());
        let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (locks, counter) = (locks.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    let _g = locks.lock("k").await;
                    let before = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert_eq!(before, 0, "two holders of one key");
                    tokio::task::yield_now().await;
                    counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
