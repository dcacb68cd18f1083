//! The `fencelock` Python package's native module, `fencelock._fencelock`:
//! the Rust client ([`fencelock`]) under Python's API: blocking calls for the
//! sync API, and `_start_*` calls that report to a callback for `fencelock.aio`
//! (asyncio). The package (`python/fencelock/`) re-exports it with the
//! exceptions and the asyncio layer written in Python.
//!
//! - `client`: `connect` and `Client` (acquire, try, check, multi-locks,
//!   and the fencelock server's own calls: watch, resize, report_refusal);
//! - `guard`: `Guard` (a held lock, a context manager) and `LostEvent`;
//! - `multi`: `MultiGuard` (the locks of one multi-lock, held together);
//! - `election`: campaigns (a leadership is a guard), leaders, observers;
//! - `watch`: `Watcher` (the events of the locks under a prefix);
//! - `errors`: Rust errors as the package's exceptions, named after the
//!   server's error codes;
//! - `runtime`: the per-process tokio runtime and the one way Python
//!   waits on it (GIL released, Ctrl-C honoured, forks detected);
//! - `args`, `capabilities`, `clock`: small conversions.

mod args;
mod capabilities;
mod client;
mod clock;
mod election;
mod errors;
mod guard;
mod held;
mod multi;
mod runtime;
mod watch;

use pyo3::prelude::*;

/// fencelock's native module.
#[pymodule]
fn _fencelock(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::_start_connect, m)?)?;
    m.add_function(wrap_pyfunction!(errors::codes, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_close_at_exit, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<guard::Guard>()?;
    m.add_class::<guard::LostEvent>()?;
    m.add_class::<runtime::Task>()?;
    m.add_class::<election::Observer>()?;
    m.add_class::<multi::MultiGuard>()?;
    m.add_class::<watch::Watcher>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
