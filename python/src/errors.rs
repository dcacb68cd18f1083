//! fencelock's errors as Python exceptions.
//!
//! The classes are Python (`fencelock/_errors.py`): one per code of
//! [`fencelock_core::ErrorCode`], the codes the HTTP API answers with, named
//! by [`class_name`] (`lease_not_found` → `LeaseNotFound`) and carrying the
//! code as `.code`; and the client's own (`ConnectError`, `Unsupported`,
//! `SecurityError`, `LockLost`). The package's tests check that the two lists
//! agree ([`codes`] is what they compare with). Every exception keeps the
//! whole message of the Rust error and of its sources.

use fencelock_core::ErrorCode;
use pyo3::prelude::*;

/// The Python class of `code`: its wire name in CamelCase.
pub fn class_name(code: ErrorCode) -> String {
    code.as_str()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

/// Every error code with its class name, for the package's consistency test.
#[pyfunction]
pub fn codes() -> Vec<(&'static str, String)> {
    ErrorCode::ALL.iter().map(|&c| (c.as_str(), class_name(c))).collect()
}

/// `fencelock.<class>(message)` with `attrs` set on it.
fn raise(class: &str, message: String, attrs: Vec<(&'static str, Py<PyAny>)>) -> PyErr {
    Python::attach(|py| {
        let made = (|| -> PyResult<PyErr> {
            let cls = py.import("fencelock._errors")?.getattr(class)?;
            let exc = cls.call1((message.clone(),))?;
            for (k, v) in attrs {
                exc.setattr(k, v)?;
            }
            Ok(PyErr::from_value(exc))
        })();
        // The package's own module missing is a broken install: say so with
        // the message rather than lose it.
        made.unwrap_or_else(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("{message} (and fencelock._errors failed: {e})"))
        })
    })
}

/// `fencelock.Error(message)`: a failure with no code of its own.
pub fn error(message: impl Into<String>) -> PyErr {
    raise("Error", message.into(), Vec::new())
}

/// The exception of `code` with `message`.
pub fn coded(code: ErrorCode, message: impl Into<String>) -> PyErr {
    raise(&class_name(code), message.into(), Vec::new())
}

/// `fencelock.InvalidArgument`: an argument refused before anything is sent.
pub fn invalid(message: impl Into<String>) -> PyErr {
    coded(ErrorCode::InvalidArgument, message)
}

/// `fencelock.LockLost`: the lease under a held lock was lost.
pub fn lock_lost(name: &str, why: &fencelock::LeaseLost) -> PyErr {
    lost(format!("the lock {name:?} was lost while held: {why}"), why)
}

/// `fencelock.LockLost` for the locks of a multi-lock (one lease: lost together).
pub fn locks_lost(names: &[String], why: &fencelock::LeaseLost) -> PyErr {
    lost(format!("the locks {names:?} were lost while held: {why}"), why)
}

fn lost(message: String, why: &fencelock::LeaseLost) -> PyErr {
    Python::attach(|py| {
        raise("LockLost", message, vec![("reason", reason(*why).into_pyobject(py).unwrap().into_any().unbind())])
    })
}

/// The short name of why a lease was lost (`guard.lost.reason`).
pub fn reason(why: fencelock::LeaseLost) -> &'static str {
    match why {
        fencelock::LeaseLost::Expired => "expired",
        fencelock::LeaseLost::NotFound => "not_found",
        fencelock::LeaseLost::Revoked => "revoked",
        fencelock::LeaseLost::Closed => "closed",
        _ => "lost",
    }
}

/// The message of `e` and of each of its sources.
fn full_message(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        next = s.source();
    }
    text
}

/// The Python exception for a client error.
pub fn from_client(e: fencelock::Error) -> PyErr {
    use fencelock::Error as E;
    let message = full_message(&e);
    Python::attach(|py| {
        let int = |v: u64| v.into_pyobject(py).unwrap().into_any().unbind();
        match e {
            E::InvalidArgument(_) => coded(ErrorCode::InvalidArgument, message),
            E::Compacted { oldest } => raise(
                &class_name(ErrorCode::Compacted),
                message,
                vec![("oldest", oldest.to_string().into_pyobject(py).unwrap().into_any().unbind())],
            ),
            E::LeaseNotFound(_) => coded(ErrorCode::LeaseNotFound, message),
            E::SlotDone { token, identity, exit_code } => raise(
                &class_name(ErrorCode::SlotDone),
                message,
                vec![
                    ("token", int(token)),
                    ("identity", identity.into_pyobject(py).unwrap().into_any().unbind()),
                    ("exit_code", exit_code.into_pyobject(py).unwrap().into_any().unbind()),
                ],
            ),
            E::Unavailable(_) | E::Timeout | E::Backend { .. } => coded(ErrorCode::Unavailable, message),
            E::Connect { .. } => raise("ConnectError", message, Vec::new()),
            E::Unauthenticated(_) => coded(ErrorCode::Unauthenticated, message),
            E::PermissionDenied(_) => coded(ErrorCode::PermissionDenied, message),
            E::LimitReached(_) => coded(ErrorCode::LimitReached, message),
            E::Unsupported(_) => raise("Unsupported", message, Vec::new()),
            E::Security { .. } => raise("SecurityError", message, Vec::new()),
            E::Protocol(_) | E::Server(_) => coded(ErrorCode::Internal, message),
            _ => error(message),
        }
    })
}

/// `fencelock.Busy`: a try found the lock held (the holder's lease and token
/// when known, the queue's length, and when a lock-delay reopens it).
pub fn busy(
    name: &str,
    holder_lease: Option<u64>,
    holder_token: Option<u64>,
    reopens_in: Option<std::time::Duration>,
    waiters: u32,
) -> PyErr {
    let why = fencelock::NotAcquired::Busy { holder_lease, holder_token, reopens_in, waiters };
    busy_with(format!("{name:?} is {why}"), holder_lease, holder_token, reopens_in, waiters)
}

/// `fencelock.Busy` for a multi-lock: one of `names` at least is not free
/// (the holder named is that lock's), and none was taken.
pub fn busy_all(
    names: &[String],
    holder_lease: Option<u64>,
    holder_token: Option<u64>,
    reopens_in: Option<std::time::Duration>,
    waiters: u32,
) -> PyErr {
    let why = fencelock::NotAcquired::Busy { holder_lease, holder_token, reopens_in, waiters };
    let message = format!("{names:?} were not taken: one of them is {why}");
    busy_with(message, holder_lease, holder_token, reopens_in, waiters)
}

fn busy_with(
    message: String,
    holder_lease: Option<u64>,
    holder_token: Option<u64>,
    reopens_in: Option<std::time::Duration>,
    waiters: u32,
) -> PyErr {
    Python::attach(|py| {
        let opt = |v: Option<u64>| v.into_pyobject(py).unwrap().into_any().unbind();
        let attrs = vec![
            ("holder_lease", opt(holder_lease)),
            ("holder_token", opt(holder_token)),
            ("reopens_in", reopens_in.map(|d| d.as_secs_f64()).into_pyobject(py).unwrap().into_any().unbind()),
            ("waiters", waiters.into_pyobject(py).unwrap().into_any().unbind()),
        ];
        raise(&class_name(ErrorCode::Busy), message, attrs)
    })
}

/// `fencelock.TimedOut`: the wait ran out before the lock was granted.
pub fn timed_out(name: &str, wait: std::time::Duration) -> PyErr {
    coded(ErrorCode::TimedOut, format!("{name:?} was not granted within the wait of {:.3} s", wait.as_secs_f64()))
}

/// `fencelock.TimedOut` for a multi-lock: not every lock of `names` was
/// granted within the wait, and none was taken.
pub fn timed_out_all(names: &[String], wait: std::time::Duration) -> PyErr {
    coded(ErrorCode::TimedOut, format!("{names:?} were not granted within the wait of {:.3} s", wait.as_secs_f64()))
}

/// `fencelock.Unsupported`: `what` is the fencelock server's alone.
pub fn native_only(kind: &str, what: &str) -> PyErr {
    from_client(fencelock::Error::Unsupported(format!(
        "{kind} has no {what}: only the fencelock backend (fencelock://) has it"
    )))
}
