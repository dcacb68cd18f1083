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

use crate::args::{seconds, Value};
use crate::errors;
use crate::guard::Guard;
use crate::runtime::Owner;

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

/// The options of one acquire, from Python's keywords.
#[allow(clippy::too_many_arguments)]
fn options(
    ttl: f64,
    wait: f64,
    shared: bool,
    permits: u32,
    weight: u32,
    identity: Option<String>,
    value: Option<Value>,
    hold_at_least: f64,
    once_per: Option<String>,
    lock_delay: f64,
    require_fencing: bool,
) -> PyResult<LockOptions> {
    let mut o = LockOptions::default()
        .ttl(seconds("ttl", ttl)?)
        .wait(seconds("wait", wait)?)
        .lock_delay(seconds("lock_delay", lock_delay)?)
        .require_fencing(require_fencing)
        .permits(permits)
        .weight(weight)
        .hold_at_least(seconds("hold_at_least", hold_at_least)?);
    if shared {
        o = o.shared();
    }
    if let Some(id) = identity {
        o = o.identity(id);
    }
    if let Some(v) = value {
        o = o.value(v.0);
    }
    if let Some(slot) = once_per {
        o = o.once_per(slot);
    }
    Ok(o)
}

#[pymethods]
impl Client {
    /// Takes the lock `name` and returns its `Guard` (a context manager that
    /// releases it). `wait=0` tries once and raises `Busy` if it is held;
    /// otherwise waits in the queue up to `wait` seconds and raises
    /// `TimedOut`. The lease lives `ttl` seconds unless renewed, and the
    /// guard renews it while it lives.
    #[pyo3(signature = (name, *, ttl=15.0, wait=0.0, shared=false, permits=0, weight=1, identity=None, value=None,
        hold_at_least=0.0, once_per=None, lock_delay=0.0, require_fencing=false))]
    #[allow(clippy::too_many_arguments)]
    fn lock(
        &self,
        py: Python<'_>,
        name: String,
        ttl: f64,
        wait: f64,
        shared: bool,
        permits: u32,
        weight: u32,
        identity: Option<String>,
        value: Option<Value>,
        hold_at_least: f64,
        once_per: Option<String>,
        lock_delay: f64,
        require_fencing: bool,
    ) -> PyResult<Guard> {
        let opts = options(
            ttl,
            wait,
            shared,
            permits,
            weight,
            identity,
            value,
            hold_at_least,
            once_per,
            lock_delay,
            require_fencing,
        )?;
        match self.acquire(py, &name, opts.clone())? {
            Outcome::Acquired(g) => Ok(g),
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                Err(errors::busy(&name, holder_lease, holder_token, reopens_in, waiters))
            }
            Outcome::TimedOut => Err(errors::timed_out(&name, opts.wait)),
        }
    }

    /// `lock`, with contention as an outcome: the `Guard`, or None if the
    /// lock was busy (`wait=0`) or the wait ran out.
    #[pyo3(signature = (name, *, ttl=15.0, wait=0.0, shared=false, permits=0, weight=1, identity=None, value=None,
        hold_at_least=0.0, once_per=None, lock_delay=0.0, require_fencing=false))]
    #[allow(clippy::too_many_arguments)]
    fn try_lock(
        &self,
        py: Python<'_>,
        name: String,
        ttl: f64,
        wait: f64,
        shared: bool,
        permits: u32,
        weight: u32,
        identity: Option<String>,
        value: Option<Value>,
        hold_at_least: f64,
        once_per: Option<String>,
        lock_delay: f64,
        require_fencing: bool,
    ) -> PyResult<Option<Guard>> {
        let opts = options(
            ttl,
            wait,
            shared,
            permits,
            weight,
            identity,
            value,
            hold_at_least,
            once_per,
            lock_delay,
            require_fencing,
        )?;
        Ok(match self.acquire(py, &name, opts)? {
            Outcome::Acquired(g) => Some(g),
            _ => None,
        })
    }

    /// Is `token` the current grant of `name`? (The resource side's check,
    /// where the backend can tell; `Unsupported` otherwise.)
    fn check(&self, py: Python<'_>, name: String, token: u64) -> PyResult<bool> {
        let backend = self.backend()?;
        let out = self.owner.wait(py, "client", async move { backend.check(&name, token).await })?;
        out.map(|c| c.current).map_err(errors::from_client)
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

    /// Closes the client: its connections go, and locks it still holds are
    /// released in the background.
    fn close(&self) {
        let backend = self.backend.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _entered = self.owner.enter();
        drop(backend);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.close();
        false
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
