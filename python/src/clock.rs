//! The package's one reading of the clock: a Rust `Instant` (a guard's
//! deadline) as the `time.monotonic()` value Python compares with. Both are
//! CLOCK_MONOTONIC on Linux; the offset is read once per conversion.

use std::time::Instant;

use pyo3::prelude::*;

/// `instant` on Python's `time.monotonic()` scale.
#[allow(clippy::disallowed_methods)] // the clock module of this crate
pub fn monotonic(py: Python<'_>, instant: Instant) -> PyResult<f64> {
    let now = Instant::now();
    let py_now: f64 = py.import("time")?.call_method0("monotonic")?.extract()?;
    Ok(match instant.checked_duration_since(now) {
        Some(ahead) => py_now + ahead.as_secs_f64(),
        None => py_now - now.duration_since(instant).as_secs_f64(),
    })
}
