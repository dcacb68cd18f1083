//! [`Held`]: what the Python object of a held grant ([`crate::guard::Guard`],
//! [`crate::multi::MultiGuard`]) keeps of its Rust guard, and the rules it
//! follows for both: the guard stays until the first release takes it, a
//! release is made once (a later one answers `False`), and dropping the
//! Python object releases in the background, except in a forked child, where
//! the locks are the parent's and are left alone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;

use crate::errors;
use crate::runtime::Owner;

/// A Rust guard that a release consumes.
pub(crate) trait Releasable: Send + 'static {
    fn release(self) -> impl Future<Output = Result<bool, fencelock::Error>> + Send;
}

impl Releasable for fencelock::Guard {
    fn release(self) -> impl Future<Output = Result<bool, fencelock::Error>> + Send {
        fencelock::Guard::release(self)
    }
}

impl Releasable for fencelock::MultiGuard {
    fn release(self) -> impl Future<Output = Result<bool, fencelock::Error>> + Send {
        fencelock::MultiGuard::release(self)
    }
}

pub(crate) struct Held<T> {
    /// The Rust guard, `None` once released. Behind an async mutex: calls on
    /// it run as tasks that a Ctrl-C may abort, and an aborted call must
    /// leave the guard here, not drop (release) it.
    inner: Arc<tokio::sync::Mutex<Option<T>>>,
    released: AtomicBool,
}

impl<T: Releasable> Held<T> {
    pub(crate) fn new(guard: T) -> Self {
        Held { inner: Arc::new(tokio::sync::Mutex::new(Some(guard))), released: AtomicBool::new(false) }
    }

    /// The guard, for a call that keeps it (`None` inside once released).
    pub(crate) fn shared(&self) -> Arc<tokio::sync::Mutex<Option<T>>> {
        self.inner.clone()
    }

    /// True once a release was asked for.
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// The release: the first call's future takes the guard and releases it;
    /// a later call's answers `Ok(false)`.
    pub(crate) fn release(&self) -> impl Future<Output = Result<bool, fencelock::Error>> + Send + 'static {
        let first = !self.released.swap(true, Ordering::SeqCst);
        let inner = self.inner.clone();
        async move {
            let taken = if first { inner.lock().await.take() } else { None };
            match taken {
                Some(guard) => guard.release().await,
                None => Ok(false),
            }
        }
    }

    /// `release()` for Python: waits with the GIL released.
    pub(crate) fn release_now(&self, py: Python<'_>, owner: &Owner) -> PyResult<bool> {
        if self.is_released() {
            return Ok(false);
        }
        owner.wait(py, "guard", self.release())?.map_err(errors::from_client)
    }

    /// asyncio's `release`: `done(ok, bool or exception)` from a client thread.
    pub(crate) fn start_release(&self, owner: &Owner, done: Py<PyAny>) -> PyResult<crate::runtime::Task> {
        owner.start("guard", self.release(), done, |py, out| {
            let released = out.map_err(errors::from_client)?;
            Ok(released.into_pyobject(py)?.to_owned().into_any().unbind())
        })
    }

    /// For the Python object's `Drop`: releases in the background, as the
    /// Rust guard does when dropped; in a forked child leaves it alone.
    pub(crate) fn drop_with(&self, owner: &Owner) {
        let Ok(mut held) = self.inner.try_lock() else {
            return; // a call still runs: the guard goes with its task
        };
        let guard = held.take();
        drop(held);
        match owner.enter() {
            Some(_entered) => drop(guard),
            None => std::mem::forget(guard),
        }
    }
}
