//! `fencelock.MultiGuard`: the locks of one atomic multi-lock
//! (`client.lock_all`), held together.
//!
//! It is the Rust client's [`fencelock::MultiGuard`]: one grant per lock, in
//! the order named, each with its own fencing token, all on one lease, so
//! they are lost together and one `lost` tells it. Like a `Guard` it is a
//! context manager that releases every lock at the block's end and raises
//! `LockLost` if they were lost inside it.

use fencelock::{LockOptions, Outcome};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use crate::errors;
use crate::guard::LostEvent;
use crate::held::Held;
use crate::runtime::{Owner, Task};

/// The locks of one multi-lock, held.
#[pyclass(frozen, module = "fencelock")]
pub struct MultiGuard {
    /// The Rust multi-guard, until released.
    held: Held<fencelock::MultiGuard>,
    /// Each lock with its token, in the order named.
    tokens: Vec<(String, Option<u64>)>,
    lease_id: u64,
    backend: &'static str,
    /// The one lease under every lock.
    watch: fencelock::LeaseWatch,
    owner: Owner,
}

impl MultiGuard {
    /// `None` for a grant without a lock (never: a multi-lock names 2 to 16).
    fn new(all: fencelock::MultiGuard, owner: Owner) -> Option<MultiGuard> {
        let first = all.guards().first()?;
        let (lease_id, backend, watch) = (first.lease_id(), first.backend(), first.lease_watch());
        let tokens = all.tokens().into_iter().map(|(name, token)| (name.to_string(), token)).collect();
        Some(MultiGuard { held: Held::new(all), tokens, lease_id, backend, watch, owner })
    }

    fn name_list(&self) -> Vec<String> {
        self.tokens.iter().map(|(name, _)| name.clone()).collect()
    }
}

/// A multi-lock's outcome as the `MultiGuard`, or `Busy` / `TimedOut` for
/// contention (`raise_contention`) or `None`.
pub fn granted(
    names: &[String],
    opts: &LockOptions,
    outcome: Outcome<fencelock::MultiGuard>,
    owner: Owner,
    raise_contention: bool,
) -> PyResult<Option<MultiGuard>> {
    match outcome {
        Outcome::Acquired(all) => match MultiGuard::new(all, owner) {
            Some(g) => Ok(Some(g)),
            None => Err(errors::error("the multi-lock was granted without a lock (a bug)")),
        },
        _ if !raise_contention => Ok(None),
        Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
            Err(errors::busy_all(names, holder_lease, holder_token, reopens_in, waiters))
        }
        Outcome::TimedOut => Err(errors::timed_out_all(names, opts.wait)),
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        self.held.drop_with(&self.owner);
    }
}

#[pymethods]
impl MultiGuard {
    /// The locks' names, in the order named.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.name_list()
    }

    /// Each lock's fencing token, by name (in the order named): a resource
    /// protected by one of the locks checks that lock's token.
    #[getter]
    fn tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, token) in &self.tokens {
            d.set_item(name, *token)?;
        }
        Ok(d)
    }

    /// The one lease every lock is held under.
    #[getter]
    fn lease_id(&self) -> u64 {
        self.lease_id
    }

    /// The backend's name, as in its URL scheme.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The `time.monotonic()` value before which the locks are surely held.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        crate::clock::monotonic(py, self.watch.deadline().into_std())
    }

    /// Set once the lease under the locks is lost (all of them are then).
    #[getter]
    fn lost(&self) -> LostEvent {
        LostEvent::new(self.watch.clone(), self.owner.clone())
    }

    /// True while keep-alives have failed for a while: stop starting new writes.
    #[getter]
    fn in_jeopardy(&self) -> bool {
        self.watch.in_jeopardy()
    }

    /// True until the locks are released or lost.
    #[getter]
    fn held(&self) -> bool {
        !self.watch.is_lost() && !self.held.is_released()
    }

    /// Releases every lock: True if each was still held and is now free,
    /// False if they were released already or lost.
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        self.held.release_now(py, &self.owner)
    }

    /// asyncio's `release`: `done(ok, bool or exception)` from a client thread.
    fn _start_release(&self, done: Py<PyAny>) -> PyResult<Task> {
        self.held.start_release(&self.owner, done)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases the locks; raises `LockLost` if they were lost inside the
    /// block (unless the block raised already: that exception goes on).
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
            return Err(errors::locks_lost(&self.name_list(), &why));
        }
        released.map(|_| false)
    }

    fn __repr__(&self) -> String {
        let tokens: Vec<String> = self
            .tokens
            .iter()
            .map(|(name, token)| format!("{name:?}: {}", token.map_or("None".to_string(), |t| t.to_string())))
            .collect();
        let state = if self.held() { "held" } else { "not held" };
        format!("<fencelock.MultiGuard {{{}}} backend={} {state}>", tokens.join(", "), self.backend)
    }
}
