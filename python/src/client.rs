//! `fencelock.connect` and `fencelock.Client`: one client over any backend
//! URL, shared by every thread of the process.
//!
//! Options keep the Rust client's names and defaults ([`LockOptions`]), in
//! seconds as floats; their limits (TTL, wait, names, sizes) are the Rust
//! client's and the server's, checked there, so Python says exactly what
//! they say.

use std::sync::Mutex;

use fencelock::{Backend, LockOptions, Outcome};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args::{lock_options, seconds, Value};
use crate::election::{self, Observer};
use crate::errors;
use crate::guard::Guard;
use crate::runtime::{Owner, Task};

/// A client of one lock service.
#[pyclass(frozen, module = "fencelock")]
pub struct Client {
    backend: Mutex<Option<Backend>>,
    kind: &'static str,
    owner: Owner,
}

impl Client {
    fn backend(&self) -> PyResult<Backend> {
        self.owner.rt("client")?;
        let b = self.backend.lock().unwrap_or_else(|e| e.into_inner());
        b.clone().ok_or_else(|| errors::error("the client is closed"))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let backend = self.backend.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        match self.owner.enter() {
            Some(_entered) => drop(backend),
            None => std::mem::forget(backend), // a forked child: the parent's connections
        }
    }
}

/// The URL with `token=` and `ca=` added (percent-encoded where needed).
fn with_params(url: &str, token: Option<&str>, tls_ca: Option<&str>) -> String {
    let mut url = url.to_string();
    for (key, value) in [("token", token), ("ca", tls_ca)] {
        if let Some(v) = value {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(key);
            url.push('=');
            url.push_str(&percent_encode(v));
        }
    }
    url
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Connects to the lock service of `url` (any backend: `fencelock://`,
/// `fencelock+tls://`, `fencelock+json://`, `redis://`, `redlock://`,
/// `etcd://`, `zk://`, `postgres://`). `token` and `tls_ca` are the
/// fencelock server's bearer token and CA file (the URL's `token=` and
/// `ca=`).
#[pyfunction]
#[pyo3(signature = (url, *, token=None, tls_ca=None))]
pub fn connect(py: Python<'_>, url: &str, token: Option<&str>, tls_ca: Option<&str>) -> PyResult<Client> {
    let owner = Owner::here()?;
    let url = with_params(url, token, tls_ca);
    let backend =
        owner.wait(py, "client", async move { fencelock::connect(&url).await })?.map_err(errors::from_client)?;
    let kind = backend.kind();
    Ok(Client { backend: Mutex::new(Some(backend)), kind, owner })
}

#[pymethods]
impl Client {
    /// Takes the lock `name` and returns its `Guard` (a context manager that
    /// releases it). Keywords (seconds as floats): `ttl=15.0`, `wait=0.0`,
    /// `shared`, `permits`, `weight`, `identity`, `value`, `hold_at_least`,
    /// `once_per`, `lock_delay`, `require_fencing`. `wait=0` tries once and
    /// raises `Busy` if the lock is held; otherwise it waits in the queue up
    /// to `wait` seconds and raises `TimedOut`. The lease lives `ttl` seconds
    /// unless renewed, and the guard renews it while it lives.
    #[pyo3(signature = (name, **options))]
    fn lock(&self, py: Python<'_>, name: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<Guard> {
        let opts = lock_options(options)?;
        let outcome = self.acquire(py, &name, opts.clone())?;
        grant_or_raise(&name, &opts, outcome)
    }

    /// `lock`, with contention as an outcome: the `Guard`, or None if the
    /// lock was busy (`wait=0`) or the wait ran out.
    #[pyo3(signature = (name, **options))]
    fn try_lock(&self, py: Python<'_>, name: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<Option<Guard>> {
        let opts = lock_options(options)?;
        Ok(match self.acquire(py, &name, opts)? {
            Outcome::Acquired(g) => Some(g),
            _ => None,
        })
    }

    /// asyncio's `lock` (`raise_contention`) and `try_lock`: starts the
    /// acquire and calls `done(ok, value)` from a client thread when it ends
    /// (`value` a `Guard`, None, or the exception). The `Task` it returns
    /// withdraws the request when cancelled.
    #[pyo3(signature = (done, name, raise_contention, **options))]
    fn _start_lock(
        &self,
        done: Py<PyAny>,
        name: String,
        raise_contention: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Task> {
        let opts = lock_options(options)?;
        let backend = self.backend()?;
        let owner = self.owner.clone();
        let fut = async move {
            let out = backend.acquire(&name, &opts).await;
            (name, opts, out)
        };
        self.owner.start("client", fut, done, move |py, (name, opts, out)| {
            let outcome = out.map_err(errors::from_client)?.map(|g| Guard::new(g, owner));
            let guard = match raise_contention {
                true => Some(grant_or_raise(&name, &opts, outcome)?),
                false => match outcome {
                    Outcome::Acquired(g) => Some(g),
                    _ => None,
                },
            };
            Ok(guard.into_pyobject(py)?.into_any().unbind())
        })
    }

    /// asyncio's `check`: `done(ok, bool or exception)`.
    fn _start_check(&self, done: Py<PyAny>, name: String, token: u64) -> PyResult<Task> {
        let backend = self.backend()?;
        let fut = async move { backend.check(&name, token).await };
        self.owner.start("client", fut, done, |py, out| {
            let current = out.map_err(errors::from_client)?.current;
            Ok(current.into_pyobject(py)?.to_owned().into_any().unbind())
        })
    }

    /// Is `token` the current grant of `name`? (The resource side's check,
    /// where the backend can tell; `Unsupported` otherwise.)
    fn check(&self, py: Python<'_>, name: String, token: u64) -> PyResult<bool> {
        let backend = self.backend()?;
        let out = self.owner.wait(py, "client", async move { backend.check(&name, token).await })?;
        out.map(|c| c.current).map_err(errors::from_client)
    }

    /// Campaigns in the election `name` and returns the leadership's `Guard`
    /// (its token is the term; the package wraps it as a `Leadership`).
    /// `wait=None` waits as long as it takes, `wait=0` tries once (`Busy`),
    /// otherwise `TimedOut` after `wait` seconds.
    #[pyo3(signature = (name, *, ttl=15.0, value=None, identity=None, wait=None))]
    fn _campaign(
        &self,
        py: Python<'_>,
        name: String,
        ttl: f64,
        value: Option<Value>,
        identity: Option<String>,
        wait: Option<f64>,
    ) -> PyResult<Guard> {
        let e = election::election(&self.backend()?, &name, ttl, value, identity)?;
        let wait = wait.map(|w| seconds("wait", w)).transpose()?;
        let out = self.owner.wait(py, "client", election::campaign(e, name, wait))?;
        election::elected(out, self.owner.clone())
    }

    /// asyncio's `_campaign`: `done(ok, Guard or exception)`.
    #[pyo3(signature = (done, name, *, ttl=15.0, value=None, identity=None, wait=None))]
    fn _start_campaign(
        &self,
        done: Py<PyAny>,
        name: String,
        ttl: f64,
        value: Option<Value>,
        identity: Option<String>,
        wait: Option<f64>,
    ) -> PyResult<Task> {
        let e = election::election(&self.backend()?, &name, ttl, value, identity)?;
        let wait = wait.map(|w| seconds("wait", w)).transpose()?;
        let owner = self.owner.clone();
        self.owner.start("client", election::campaign(e, name, wait), done, move |py, out| {
            Ok(Py::new(py, election::elected(out, owner)?)?.into_any())
        })
    }

    /// The current leader of `name` as `(kind, name, term, value, identity)`,
    /// or None when nobody leads.
    fn _leader(&self, py: Python<'_>, name: String) -> PyResult<Option<Py<PyTuple>>> {
        let backend = self.backend()?;
        let out = self.owner.wait(py, "client", async move { backend.leader(&name).await })?;
        match out.map_err(errors::from_client)? {
            Some(l) => Ok(Some(election::leader_tuple(py, "leader", &l)?.unbind())),
            None => Ok(None),
        }
    }

    /// asyncio's `_leader`.
    fn _start_leader(&self, done: Py<PyAny>, name: String) -> PyResult<Task> {
        let backend = self.backend()?;
        let fut = async move { backend.leader(&name).await };
        self.owner.start("client", fut, done, |py, out| match out.map_err(errors::from_client)? {
            Some(l) => Ok(election::leader_tuple(py, "leader", &l)?.into_any().unbind()),
            None => Ok(py.None()),
        })
    }

    /// Follows the election `name`: the current leader first (if any), then
    /// every change.
    fn _observe(&self, py: Python<'_>, name: String) -> PyResult<Observer> {
        let backend = self.backend()?;
        let watched = name.clone();
        let out = self.owner.wait(py, "client", async move { backend.observe(&watched).await })?;
        Ok(Observer::new(name, out.map_err(errors::from_client)?, self.owner.clone()))
    }

    /// asyncio's `_observe`.
    fn _start_observe(&self, done: Py<PyAny>, name: String) -> PyResult<Task> {
        let backend = self.backend()?;
        let watched = name.clone();
        let owner = self.owner.clone();
        let fut = async move { backend.observe(&watched).await };
        self.owner.start("client", fut, done, move |py, out| {
            Ok(Py::new(py, Observer::new(name, out.map_err(errors::from_client)?, owner))?.into_any())
        })
    }

    /// The backend's name, as in its URL scheme.
    #[getter]
    fn backend_kind(&self) -> &'static str {
        self.kind
    }

    /// What the backend guarantees (fencing, durable tokens, FIFO, …), as
    /// a dict of its declared capabilities.
    fn capabilities(&self) -> PyResult<std::collections::BTreeMap<&'static str, crate::capabilities::Cap>> {
        let c = self.backend()?.capabilities();
        Ok(crate::capabilities::describe(&c))
    }

    /// Closes the client: the lease it keeps between locks for the next one
    /// is revoked, and the server's answer waited for (within the RPC
    /// timeout; see `LockBackend::close`), so that no lease of a short
    /// script outlives it by a TTL; then its connections go, and locks it
    /// still holds are released in the background.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(backend) = self.backend.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        let backend = self.owner.wait(py, "client", async move {
            backend.close().await;
            backend
        })?;
        let _entered = self.owner.enter();
        drop(backend);
        Ok(())
    }

    /// [`Client::close`] without waiting (for asyncio, whose loop must not
    /// block): the lingering lease is revoked in the background.
    fn _close_later(&self) {
        let backend = self.backend.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _entered = self.owner.enter();
        drop(backend);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<fencelock.Client backend={}>", self.kind)
    }
}

impl Client {
    /// Acquires `name` with `opts`, waiting with the GIL released; a
    /// Ctrl-C withdraws the request.
    fn acquire(&self, py: Python<'_>, name: &str, opts: LockOptions) -> PyResult<Outcome<Guard>> {
        let backend = self.backend()?;
        let name = name.to_string();
        let out = self.owner.wait(py, "client", async move { backend.acquire(&name, &opts).await })?;
        let outcome = out.map_err(errors::from_client)?;
        Ok(outcome.map(|g| Guard::new(g, self.owner.clone())))
    }
}

/// The guard of an outcome, or `Busy` / `TimedOut` for contention.
fn grant_or_raise(name: &str, opts: &LockOptions, outcome: Outcome<Guard>) -> PyResult<Guard> {
    match outcome {
        Outcome::Acquired(g) => Ok(g),
        Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
            Err(errors::busy(name, holder_lease, holder_token, reopens_in, waiters))
        }
        Outcome::TimedOut => Err(errors::timed_out(name, opts.wait)),
    }
}

/// asyncio's `connect`: `done(ok, Client or exception)` from a client thread.
#[pyfunction]
#[pyo3(signature = (done, url, *, token=None, tls_ca=None))]
pub fn _start_connect(done: Py<PyAny>, url: &str, token: Option<&str>, tls_ca: Option<&str>) -> PyResult<Task> {
    let owner = Owner::here()?;
    let url = with_params(url, token, tls_ca);
    let fut = async move { fencelock::connect(&url).await };
    let made = owner.clone();
    owner.start("client", fut, done, move |py, out| {
        let backend = out.map_err(errors::from_client)?;
        let kind = backend.kind();
        let client = Client { backend: Mutex::new(Some(backend)), kind, owner: made };
        Ok(Py::new(py, client)?.into_any())
    })
}
