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
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
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

    /// Starts `fut` on the runtime for asyncio: when it ends, `convert` makes
    /// its Python value (with the GIL, on a client thread) and `done(ok,
    /// value)` is called there (`value` the exception when not `ok`); the
    /// Python side hands it to its event loop. The returned `Task` drops the
    /// future when cancelled (an acquire leaves the queue), and `done` is
    /// then never called.
    pub fn start<T, F, C>(&self, what: &str, fut: F, done: Py<PyAny>, convert: C) -> PyResult<Task>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let rt = self.rt(what)?;
        let handle = rt.spawn(async move {
            // A panic must still answer: the awaiting coroutine would wait forever.
            let out = AssertUnwindSafe(fut).catch_unwind().await;
            let Some(_inside) = InPython::enter() else { return };
            Python::attach(|py| {
                let made = match out {
                    Ok(v) => {
                        std::panic::catch_unwind(AssertUnwindSafe(|| convert(py, v))).unwrap_or_else(|p| Err(bug(&p)))
                    }
                    Err(p) => Err(bug(&p)),
                };
                let (ok, value) = match made {
                    Ok(v) => (true, v),
                    Err(e) => (false, e.into_value(py).into_any()),
                };
                if let Err(e) = done.call1(py, (ok, value)) {
                    e.write_unraisable(py, None);
                }
            });
        });
        Ok(Task(Mutex::new(Some(handle.abort_handle()))))
    }

    /// Enters the runtime for the rest of the scope, so that what is dropped
    /// there (a guard releasing in the background) finds it. `None` in a
    /// forked child.
    pub fn enter(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
        self.is_here().then(|| self.rt.enter())
    }
}

/// Set by [`close_at_exit`]: the interpreter is about to finalize, and no
/// client thread may take the GIL any more (one that tries during
/// finalization aborts the process).
static CLOSING: AtomicBool = AtomicBool::new(false);
/// Client threads inside Python (calling a started call's `done`).
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// A client thread's permission to call into Python, counted in
/// [`IN_PYTHON`] until dropped; `None` once the interpreter is closing.
struct InPython;

impl InPython {
    fn enter() -> Option<InPython> {
        IN_PYTHON.fetch_add(1, Ordering::SeqCst);
        if CLOSING.load(Ordering::SeqCst) {
            IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(InPython)
    }
}

impl Drop for InPython {
    fn drop(&mut self) {
        IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Registered with `atexit` by the package: from now on no client thread
/// enters Python, and those inside it are waited for (up to 2 s, with the
/// GIL released so that they can finish) before the interpreter finalizes.
#[pyfunction]
pub fn _close_at_exit(py: Python<'_>) {
    CLOSING.store(true, Ordering::SeqCst);
    py.detach(|| {
        for _ in 0..200 {
            if IN_PYTHON.load(Ordering::SeqCst) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// `fencelock.Error` for a panic inside the client (a bug), with its message.
fn bug(panic: &Box<dyn std::any::Any + Send>) -> PyErr {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    errors::error(format!("the client failed inside (a bug): {text}"))
}

/// A call started for asyncio ([`Owner::start`]).
#[pyclass(frozen, module = "fencelock")]
pub struct Task(Mutex<Option<tokio::task::AbortHandle>>);

#[pymethods]
impl Task {
    /// Drops the call's future: a waiting acquire leaves the queue. Nothing
    /// if it ended already.
    fn cancel(&self) {
        if let Some(h) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.abort();
        }
    }
}
