//! `client.watch(prefix)` for Python: `Watcher`, the events of the locks
//! under a prefix, one at a time, for the package's iterator and async
//! iterator (`fencelock/_watch.py`).
//!
//! It is the Rust client's [`fencelock::WatchStream`] (the native backend's
//! `Client::watch_from`): events in revision order, each once, resumed by the
//! client after a broken stream or a failed server. An event crosses to
//! Python as a plain tuple (see [`event_tuple`]) that the package makes into
//! a `fencelock.WatchEvent`.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use fencelock::{LockMode, WatchEvent, WatchStream};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors;
use crate::runtime::{Owner, Task};

/// `(index, seq, kind, lock, lease_id, token, identity, reason, value, mode,
/// highest_token, resource)` of an event: its revision, its kind as the
/// server names it (`granted`, …, `write_refused`), and the Rust event's
/// other fields.
fn event_tuple<'py>(py: Python<'py>, e: &WatchEvent) -> PyResult<Bound<'py, PyTuple>> {
    let mode = match e.mode {
        LockMode::Shared => "shared",
        LockMode::Exclusive => "exclusive",
    };
    let items: [Bound<'py, PyAny>; 12] = [
        e.revision.index.into_pyobject(py)?.into_any(),
        e.revision.seq.into_pyobject(py)?.into_any(),
        e.kind.as_str().into_pyobject(py)?.into_any(),
        e.lock.as_str().into_pyobject(py)?.into_any(),
        e.lease_id.into_pyobject(py)?.into_any(),
        e.token.into_pyobject(py)?.into_any(),
        e.identity.as_str().into_pyobject(py)?.into_any(),
        e.reason.as_str().into_pyobject(py)?.into_any(),
        PyBytes::new(py, &e.value).into_any(),
        mode.into_pyobject(py)?.into_any(),
        e.highest_token.into_pyobject(py)?.into_any(),
        e.resource.as_str().into_pyobject(py)?.into_any(),
    ];
    PyTuple::new(py, items)
}

/// The events of a watch (`client.watch(prefix)`).
#[pyclass(frozen, module = "fencelock")]
pub struct Watcher {
    /// Dropped only in the process that made it (see `Drop`): dropping it
    /// ends the watch.
    stream: ManuallyDrop<Arc<tokio::sync::Mutex<WatchStream>>>,
    owner: Owner,
}

impl Watcher {
    pub fn new(stream: WatchStream, owner: Owner) -> Watcher {
        Watcher { stream: ManuallyDrop::new(Arc::new(tokio::sync::Mutex::new(stream))), owner }
    }
}

#[pymethods]
impl Watcher {
    /// The next event as its tuple, waiting as long as it takes (Ctrl-C
    /// interrupts); None once the watch has ended. An error that ends the
    /// watch (`Compacted`, a refused permission) is raised.
    fn next(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        let stream = Arc::clone(&self.stream);
        let out = self.owner.wait(py, "watch", async move { stream.lock().await.next_event().await })?;
        match out {
            None => Ok(None),
            Some(Err(e)) => Err(errors::from_client(e)),
            Some(Ok(event)) => Ok(Some(event_tuple(py, &event)?.unbind())),
        }
    }

    /// asyncio's `next`: `done(ok, tuple, None or exception)`.
    fn _start_next(&self, done: Py<PyAny>) -> PyResult<Task> {
        let stream = Arc::clone(&self.stream);
        let fut = async move { stream.lock().await.next_event().await };
        self.owner.start("watch", fut, done, |py, out| match out {
            None => Ok(py.None()),
            Some(Err(e)) => Err(errors::from_client(e)),
            Some(Ok(event)) => Ok(event_tuple(py, &event)?.into_any().unbind()),
        })
    }
}

impl Drop for Watcher {
    /// Ends the watch; in a forked child the stream's task is the parent's,
    /// and is left alone.
    fn drop(&mut self) {
        if let Some(_entered) = self.owner.enter() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.stream) }
        }
    }
}
