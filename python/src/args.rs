//! Python arguments as the Rust client's types: seconds (floats) as
//! durations, bytes or str as bytes. A bad one is `InvalidArgument` before
//! anything is sent.

use std::time::Duration;

use fencelock::LockOptions;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// `value` seconds (a float, finite, not negative) as a `Duration`.
pub fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        errors::invalid(format!("{what} must be a number of seconds, finite and not negative (got {value})"))
    })
}

/// A revision of the group's event history, as `INDEX.SEQ` or `INDEX`
/// (where a watch starts, inclusive).
pub fn revision(text: &str) -> PyResult<fencelock::Revision> {
    text.parse().map_err(|e: fencelock::ParseRevisionError| errors::invalid(format!("from_revision: {e}")))
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

/// The keywords of `client.lock()` and `client.try_lock()`, with the Rust
/// client's defaults (`LockOptions::default()`: a 15 s TTL, no wait): the
/// one place that names them. An unknown keyword is `InvalidArgument`.
pub const LOCK_KEYWORDS: [&str; 11] = [
    "ttl",
    "wait",
    "shared",
    "permits",
    "weight",
    "identity",
    "value",
    "hold_at_least",
    "once_per",
    "lock_delay",
    "require_fencing",
];

/// `LockOptions` from the keywords of an acquire.
pub fn lock_options(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<LockOptions> {
    let mut o = LockOptions::default();
    let Some(kwargs) = kwargs else { return Ok(o) };
    for (key, value) in kwargs.iter() {
        let key: String = key.extract()?;
        let bad = |what: &str| errors::invalid(format!("{key} must be {what}"));
        o = match key.as_str() {
            "ttl" => o.ttl(seconds("ttl", value.extract().map_err(|_| bad("a number of seconds"))?)?),
            "wait" => o.wait(seconds("wait", value.extract().map_err(|_| bad("a number of seconds"))?)?),
            "lock_delay" => {
                o.lock_delay(seconds("lock_delay", value.extract().map_err(|_| bad("a number of seconds"))?)?)
            }
            "hold_at_least" => {
                o.hold_at_least(seconds("hold_at_least", value.extract().map_err(|_| bad("a number of seconds"))?)?)
            }
            "shared" => match value.extract::<bool>().map_err(|_| bad("True or False"))? {
                true => o.shared(),
                false => o,
            },
            "require_fencing" => o.require_fencing(value.extract().map_err(|_| bad("True or False"))?),
            "permits" => o.permits(value.extract().map_err(|_| bad("an int from 0 to 2**32 - 1"))?),
            "weight" => o.weight(value.extract().map_err(|_| bad("an int from 1 to 2**32 - 1"))?),
            "identity" => match value.extract::<Option<String>>().map_err(|_| bad("a str or None"))? {
                Some(id) => o.identity(id),
                None => o,
            },
            "value" => match value.extract::<Option<Value>>()? {
                Some(v) => o.value(v.0),
                None => o,
            },
            "once_per" => match value.extract::<Option<String>>().map_err(|_| bad("a str or None"))? {
                Some(slot) => o.once_per(slot),
                None => o,
            },
            other => {
                return Err(errors::invalid(format!(
                    "unknown option {other:?}: the options are {}",
                    LOCK_KEYWORDS.join(", ")
                )))
            }
        };
    }
    Ok(o)
}
