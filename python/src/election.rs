//! Leader election for Python: `Client._campaign` (a leadership is a held
//! lock, so the Python side wraps the `Guard` it answers: its token is the
//! term), `Client.leader`, and `Observer` (the changes of an election, one
//! at a time, for `client.observe()` as an iterator or async iterator).
//!
//! Leaders and events cross to Python as plain tuples `(kind, name, term,
//! value, identity)` that `fencelock/_election.py` makes into `Leader` and
//! `Vacant`.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Backend, Election, LeaderEvent, LeaderStream, Outcome};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::args::{seconds, Value};
use crate::errors;
use crate::guard::Guard;
use crate::runtime::{Owner, Task};

/// The election `name` of `backend` with a candidate's settings.
pub fn election(
    backend: &Backend,
    name: &str,
    ttl: f64,
    value: Option<Value>,
    identity: Option<String>,
) -> PyResult<Election> {
    let mut e = backend.election(name).ttl(seconds("ttl", ttl)?);
    if let Some(v) = value {
        e = e.value(v.0);
    }
    if let Some(id) = identity {
        e = e.identity(id);
    }
    Ok(e)
}

/// Campaigns: elected (the leadership's guard), `Busy` for a try
/// (`wait=0`) that found a leader, `TimedOut` when `wait` ran out first
/// (`None`: wait as long as it takes).
pub async fn campaign(
    election: Election,
    name: String,
    wait: Option<Duration>,
) -> Result<Result<fencelock::Guard, PyErrMaker>, fencelock::Error> {
    let won = match wait {
        Some(w) if w.is_zero() => match election.try_campaign().await? {
            Outcome::Acquired(l) => Ok(l),
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                Err(PyErrMaker::Busy { name, holder_lease, holder_token, reopens_in, waiters })
            }
            Outcome::TimedOut => Err(PyErrMaker::TimedOut { name, wait: Duration::ZERO }),
        },
        Some(w) => match tokio::time::timeout(w, election.campaign()).await {
            Ok(l) => Ok(l?),
            Err(_) => Err(PyErrMaker::TimedOut { name, wait: w }),
        },
        None => Ok(election.campaign().await?),
    };
    Ok(won.map(fencelock::Leadership::into_guard))
}

/// A contention outcome, made into its exception once the GIL is held.
pub enum PyErrMaker {
    Busy {
        name: String,
        holder_lease: Option<u64>,
        holder_token: Option<u64>,
        reopens_in: Option<Duration>,
        waiters: u32,
    },
    TimedOut {
        name: String,
        wait: Duration,
    },
}

impl PyErrMaker {
    pub fn make(self) -> PyErr {
        match self {
            PyErrMaker::Busy { name, holder_lease, holder_token, reopens_in, waiters } => {
                errors::busy(&name, holder_lease, holder_token, reopens_in, waiters)
            }
            PyErrMaker::TimedOut { name, wait } => errors::timed_out(&name, wait),
        }
    }
}

/// The guard of a campaign's outcome, or its exception.
pub fn elected(out: Result<Result<fencelock::Guard, PyErrMaker>, fencelock::Error>, owner: Owner) -> PyResult<Guard> {
    match out.map_err(errors::from_client)? {
        Ok(g) => Ok(Guard::new(g, owner)),
        Err(contention) => Err(contention.make()),
    }
}

/// `(kind, name, term, value, identity)` of a leader.
pub fn leader_tuple<'py>(py: Python<'py>, kind: &str, l: &fencelock::Leader) -> PyResult<Bound<'py, PyTuple>> {
    let value = PyBytes::new(py, &l.value);
    (kind, l.name.as_str(), l.term, value, l.identity.as_deref()).into_pyobject(py)
}

/// An event as its tuple: a leader, or a vacancy after `term`.
fn event_tuple<'py>(py: Python<'py>, name: &str, e: &LeaderEvent) -> PyResult<Bound<'py, PyTuple>> {
    match e {
        LeaderEvent::Leader(l) => leader_tuple(py, "leader", l),
        LeaderEvent::Vacant { term } => ("vacant", name, *term, py.None(), py.None()).into_pyobject(py),
        _ => ("unknown", name, e.term(), py.None(), py.None()).into_pyobject(py),
    }
}

/// The changes of one election (`client.observe(name)`).
#[pyclass(frozen, module = "fencelock")]
pub struct Observer {
    name: String,
    /// Dropped only in the process that made it (see `Drop`).
    stream: ManuallyDrop<Arc<tokio::sync::Mutex<LeaderStream>>>,
    owner: Owner,
}

impl Observer {
    pub fn new(name: String, stream: LeaderStream, owner: Owner) -> Observer {
        Observer { name, stream: ManuallyDrop::new(Arc::new(tokio::sync::Mutex::new(stream))), owner }
    }
}

#[pymethods]
impl Observer {
    /// The next event as its tuple, waiting as long as it takes (Ctrl-C
    /// interrupts); None once the observation has ended.
    fn next(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        let stream = Arc::clone(&self.stream);
        let out = self.owner.wait(py, "observer", async move { stream.lock().await.next_event().await })?;
        match out {
            None => Ok(None),
            Some(Err(e)) => Err(errors::from_client(e)),
            Some(Ok(event)) => Ok(Some(event_tuple(py, &self.name, &event)?.unbind())),
        }
    }

    /// asyncio's `next`: `done(ok, tuple, None or exception)`.
    fn _start_next(&self, done: Py<PyAny>) -> PyResult<Task> {
        let stream = Arc::clone(&self.stream);
        let name = self.name.clone();
        let fut = async move { stream.lock().await.next_event().await };
        self.owner.start("observer", fut, done, move |py, out| match out {
            None => Ok(py.None()),
            Some(Err(e)) => Err(errors::from_client(e)),
            Some(Ok(event)) => Ok(event_tuple(py, &name, &event)?.into_any().unbind()),
        })
    }
}

impl Drop for Observer {
    /// Ends the observation; in a forked child the stream's task is the
    /// parent's, and is left alone.
    fn drop(&mut self) {
        if let Some(_entered) = self.owner.enter() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.stream) }
        }
    }
}
