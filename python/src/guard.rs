//! `fencelock.Guard` (a held lock) and `fencelock.LostEvent` (its `lost`).
//!
//! A guard is the Rust client's [`fencelock::Guard`]: its lease is renewed on
//! the runtime's threads whatever Python does, and `lost` is set the moment
//! the client can no longer prove the lock held. Used as a context manager,
//! it releases the lock at the block's end and raises `LockLost` if the lock
//! was lost inside the block, so lost work is never silent.

use std::future::Future;
use std::pin::Pin;

use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::args::Value;
use crate::errors;
use crate::held::Held;
use crate::runtime::{Owner, Task};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A held lock.
#[pyclass(frozen, module = "fencelock")]
pub struct Guard {
    /// The Rust guard, until released.
    held: Held<fencelock::Guard>,
    name: String,
    token: Option<u64>,
    lease_id: u64,
    backend: &'static str,
    watch: fencelock::LeaseWatch,
    owner: Owner,
}

impl Guard {
    pub fn new(guard: fencelock::Guard, owner: Owner) -> Guard {
        Guard {
            name: guard.name().to_string(),
            token: guard.token(),
            lease_id: guard.lease_id(),
            backend: guard.backend(),
            watch: guard.lease_watch(),
            held: Held::new(guard),
            owner,
        }
    }

    /// Runs `call` on the held Rust guard (waiting with the GIL released);
    /// `Ok(false)` if it was released already.
    fn call<F>(&self, py: Python<'_>, call: F) -> PyResult<bool>
    where
        F: for<'g> FnOnce(&'g fencelock::Guard) -> BoxFuture<'g, Result<bool, fencelock::Error>> + Send + 'static,
    {
        let inner = self.held.shared();
        let out = self.owner.wait(py, "guard", async move {
            let held = inner.lock().await;
            match held.as_ref() {
                Some(g) => call(g).await,
                None => Ok(false),
            }
        })?;
        out.map_err(errors::from_client)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.held.drop_with(&self.owner);
    }
}

#[pymethods]
impl Guard {
    /// The lock's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token (an int that only grows per lock), or None on a
    /// backend without fencing tokens (Redlock).
    #[getter]
    fn token(&self) -> Option<u64> {
        self.token
    }

    /// The lease the lock is held under.
    #[getter]
    fn lease_id(&self) -> u64 {
        self.lease_id
    }

    /// The backend's name, as in its URL scheme.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The `time.monotonic()` value before which the lease is surely held.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        crate::clock::monotonic(py, self.watch.deadline().into_std())
    }

    /// Set once the lease is lost (an event: `is_set()`, `wait(timeout)`).
    #[getter]
    fn lost(&self) -> LostEvent {
        LostEvent::new(self.watch.clone(), self.owner.clone())
    }

    /// True while keep-alives have failed for a while (deadline minus TTL/3
    /// passed): stop starting new writes.
    #[getter]
    fn in_jeopardy(&self) -> bool {
        self.watch.in_jeopardy()
    }

    /// True until the lock is released or lost.
    #[getter]
    fn held(&self) -> bool {
        !self.watch.is_lost() && !self.held.is_released()
    }

    /// Releases the lock: True if this released a grant still held, False
    /// if it was released already or lost (release is compare-and-delete: it
    /// never frees a lock that went to someone else).
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        self.held.release_now(py, &self.owner)
    }

    /// asyncio's `release`: `done(ok, bool or exception)` from a client thread.
    fn _start_release(&self, done: Py<PyAny>) -> PyResult<Task> {
        self.held.start_release(&self.owner, done)
    }

    /// Publishes `value` (bytes or str) with the grant, where the backend
    /// keeps one (an election's leader address); False if the lock is no
    /// longer held.
    fn set_value(&self, py: Python<'_>, value: Value) -> PyResult<bool> {
        let bytes = value.0;
        self.call(py, move |g| Box::pin(g.set_value(bytes)))
    }

    /// asyncio's `set_value`: `done(ok, bool or exception)`.
    fn _start_set_value(&self, done: Py<PyAny>, value: Value) -> PyResult<Task> {
        let bytes = value.0;
        let inner = self.held.shared();
        let fut = async move {
            let held = inner.lock().await;
            match held.as_ref() {
                Some(g) => g.set_value(bytes).await,
                None => Ok(false),
            }
        };
        self.owner.start("guard", fut, done, |py, out| {
            let set = out.map_err(errors::from_client)?;
            Ok(set.into_pyobject(py)?.to_owned().into_any().unbind())
        })
    }

    /// Records that this run completed the once-per slot `slot` with
    /// `exit_code` (no later acquire with `once_per=slot` is granted); False
    /// if the lock is no longer held.
    fn complete_slot(&self, py: Python<'_>, slot: String, exit_code: i32) -> PyResult<bool> {
        self.call(py, move |g| Box::pin(async move { g.complete_slot(&slot, exit_code).await }))
    }

    /// A writer of a read-write lock becomes a reader without letting go;
    /// False if the lock is no longer held.
    fn downgrade(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |g| Box::pin(g.downgrade()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases the lock; raises `LockLost` if it was lost inside the block
    /// (unless the block raised already: that exception goes on).
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyType>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let lost = self.watch.lost_reason();
        let released = self.release(py);
        if exc_type.is_some() {
            return Ok(false);
        }
        if let Some(why) = lost {
            return Err(errors::lock_lost(&self.name, &why));
        }
        released.map(|_| false)
    }

    fn __repr__(&self) -> String {
        let token = self.token.map_or("None".to_string(), |t| t.to_string());
        let state = if self.held() { "held" } else { "not held" };
        format!("<fencelock.Guard {:?} token={token} backend={} {state}>", self.name, self.backend)
    }
}

/// A guard's `lost`: set once the lease under the lock is lost, never
/// cleared. Like `threading.Event`: `is_set()`, `wait(timeout=None)`.
#[pyclass(frozen, module = "fencelock")]
pub struct LostEvent {
    watch: fencelock::LeaseWatch,
    owner: Owner,
}

impl LostEvent {
    /// The event of the lease `watch` follows.
    pub fn new(watch: fencelock::LeaseWatch, owner: Owner) -> LostEvent {
        LostEvent { watch, owner }
    }
}

#[pymethods]
impl LostEvent {
    /// True once the lease is lost.
    fn is_set(&self) -> bool {
        self.watch.is_lost()
    }

    /// Waits until the lease is lost or `timeout` seconds pass (None: no
    /// limit); returns `is_set()`. Ctrl-C interrupts it.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let watch = self.watch.clone();
        match timeout {
            None => {
                self.owner.wait(py, "guard", async move { watch.lost().await })?;
            }
            Some(t) => {
                let t = crate::args::seconds("timeout", t)?;
                self.owner.wait(py, "guard", async move { tokio::time::timeout(t, watch.lost()).await.ok() })?;
            }
        }
        Ok(self.watch.is_lost())
    }

    /// asyncio's `wait`: `done(True, is_set())` once the lease is lost or
    /// `timeout` seconds pass (None: no limit).
    #[pyo3(signature = (done, timeout=None))]
    fn _start_wait(&self, done: Py<PyAny>, timeout: Option<f64>) -> PyResult<Task> {
        let limit = timeout.map(|t| crate::args::seconds("timeout", t)).transpose()?;
        let watch = self.watch.clone();
        let fut = async move {
            match limit {
                Some(t) => {
                    let _ = tokio::time::timeout(t, watch.lost()).await;
                }
                None => {
                    watch.lost().await;
                }
            }
            watch.is_lost()
        };
        self.owner.start("guard", fut, done, |py, set| Ok(set.into_pyobject(py)?.to_owned().into_any().unbind()))
    }

    /// Why the lease was lost (expired, not_found, revoked, closed), or None.
    #[getter]
    fn reason(&self) -> Option<&'static str> {
        self.watch.lost_reason().map(errors::reason)
    }

    fn __repr__(&self) -> String {
        match self.watch.lost_reason() {
            Some(why) => format!("<fencelock.LostEvent set: {}>", errors::reason(why)),
            None => "<fencelock.LostEvent not set>".to_string(),
        }
    }
}
