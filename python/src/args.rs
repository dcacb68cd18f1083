//! Python arguments as the Rust client's types: seconds (floats) as
//! durations, bytes or str as bytes. A bad one is `InvalidArgument` before
//! anything is sent.

use std::time::Duration;

use pyo3::prelude::*;

use crate::errors;

/// `value` seconds (a float, finite, not negative) as a `Duration`.
pub fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        errors::invalid(format!("{what} must be a number of seconds, finite and not negative (got {value})"))
    })
}

/// Bytes or a str (UTF-8).
pub struct Value(pub Vec<u8>);

impl<'py> FromPyObject<'_, 'py> for Value {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'_, 'py, PyAny>) -> PyResult<Value> {
        if let Ok(s) = ob.extract::<String>() {
            return Ok(Value(s.into_bytes()));
        }
        ob.extract::<Vec<u8>>().map(Value).map_err(|_| errors::invalid("value must be bytes or str"))
    }
}
