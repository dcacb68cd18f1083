//! The tokio runtime under every Python call, one per process, and the one
//! way Python waits on it.
//!
//! Python threads block in [`wait`] with the GIL released, so other Python
//! threads run and the guards' keep-alives (tokio tasks on the runtime's own
//! threads) never wait for Python. A wait wakes every [`SLICE`] to let Python
//! run its signal handlers: Ctrl-C raises `KeyboardInterrupt` and drops the
//! Rust future, which withdraws a queued acquire.
//!
//! A fork copies only the forking thread: the child has none of the
//! runtime's threads. [`Owner`] records the process that made a client, and
//! every call from another process fails with a clear error instead of
//! waiting for threads that do not exist; `fencelock.connect` in the child
//! makes a runtime of its own.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::errors;

/// How often a blocked call lets Python check for signals.
const SLICE: Duration = Duration::from_millis(50);

/// The runtime of this process, made on first use (and again in a forked
/// child, whose copy of its parent's has no threads).
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// This process's runtime.
pub fn runtime() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    // A parent's runtime, copied by fork: its threads are not here, and
    // dropping it would wait for them. Leaked on purpose.
    if let Some(old) = slot.take() {
        std::mem::forget(old);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fencelock")
        .enable_all()
        .build()
        .map_err(|e| errors::error(format!("cannot start the client's threads: {e}")))?;
    let rt = Arc::new(rt);
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// The process that made an object bound to a runtime (a client, a guard).
#[derive(Debug, Clone)]
pub struct Owner {
    pid: u32,
    rt: Arc<Runtime>,
}

impl Owner {
    /// Bound to this process's runtime.
    pub fn here() -> PyResult<Owner> {
        Ok(Owner { pid: std::process::id(), rt: runtime()? })
    }

    /// Whether this process made the object (false in a forked child).
    pub fn is_here(&self) -> bool {
        self.pid == std::process::id()
    }

    /// The runtime, or the error a forked child gets.
    pub fn rt(&self, what: &str) -> PyResult<&Arc<Runtime>> {
        if self.is_here() {
            Ok(&self.rt)
        } else {
            Err(errors::error(format!(
                "this {what} was made in process {} and this is process {} (a fork): call fencelock.connect() \
                 again in this process; locks held by the parent stay the parent's",
                self.pid,
                std::process::id()
            )))
        }
    }

    /// Runs `fut` on the runtime and waits for it with the GIL released,
    /// waking every [`SLICE`] for Python's signal handlers: if one raises
    /// (Ctrl-C), the future is dropped (an acquire leaves the queue) and its
    /// exception returned. A panic in the future becomes `fencelock.Error`.
    pub fn wait<T, F>(&self, py: Python<'_>, what: &str, fut: F) -> PyResult<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let rt = self.rt(what)?;
        let mut task = rt.spawn(fut);
        loop {
            let done = py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, &mut task).await }));
            match done {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => return Err(errors::error(format!("the client failed inside (a bug): {e}"))),
                Err(_) => {
                    if let Err(interrupted) = py.check_signals() {
                        task.abort();
                        return Err(interrupted);
                    }
                }
            }
        }
    }

    /// Enters the runtime for the rest of the scope, so that what is dropped
    /// there (a guard releasing in the background) finds it. `None` in a
    /// forked child.
    pub fn enter(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
        self.is_here().then(|| self.rt.enter())
    }
}
