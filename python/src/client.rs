//! `fencelock.connect` and `fencelock.Client`: one client over any backend
//! URL, shared by every thread of the process.
//!
//! Options keep the Rust client's names and defaults ([`LockOptions`]), in
//! seconds as floats; their limits (TTL, wait, names, sizes) are the Rust
//! client's and the server's, checked there, so Python says exactly what
//! they say.

use std::sync::{Arc, Mutex};

use fencelock::backend::{BackendUrl, Scheme};
use fencelock::{Backend, LockOptions, Outcome};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args::{lock_options, seconds, Value};
use crate::election::{self, Observer};
use crate::errors;
use crate::guard::Guard;
use crate::multi::{self, MultiGuard};
use crate::runtime::{Owner, Task};
use crate::watch::Watcher;

/// A client of one lock service.
#[pyclass(frozen, module = "fencelock")]
pub struct Client {
    conn: Mutex<Option<Conn>>,
    kind: &'static str,
    owner: Owner,
}

/// A client's connection: the backend, and for the fencelock server its
/// native client too (the calls only it has: watch, resize, report_refusal).
#[derive(Clone)]
struct Conn {
    backend: Backend,
    native: Option<fencelock::Client>,
}

impl Conn {
    /// Connects to `url` as `fencelock::connect` does, keeping the native
    /// client of a `fencelock://` URL.
    async fn open(url: String) -> Result<Conn, fencelock::Error> {
        if matches!(BackendUrl::parse(&url), Ok(u) if matches!(u.scheme, Scheme::Native)) {
            let native = fencelock::Client::connect(url).await?;
            return Ok(Conn { backend: Arc::new(native.clone()), native: Some(native) });
        }
        Ok(Conn { backend: fencelock::connect(&url).await?, native: None })
    }
}

impl Client {
    fn new(conn: Conn, owner: Owner) -> Client {
        let kind = conn.backend.kind();
        Client { conn: Mutex::new(Some(conn)), kind, owner }
    }

    fn conn(&self) -> PyResult<Conn> {
        self.owner.rt("client")?;
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        c.clone().ok_or_else(|| errors::error("the client is closed"))
    }

    fn backend(&self) -> PyResult<Backend> {
        Ok(self.conn()?.backend)
    }

    /// The native client, or `Unsupported` (nothing sent) for `what` on
    /// another backend.
    fn native(&self, what: &str) -> PyResult<fencelock::Client> {
        self.conn()?.native.ok_or_else(|| errors::native_only(self.kind, what))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let conn = self.conn.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        match self.owner.enter() {
            Some(_entered) => drop(conn),
            None => std::mem::forget(conn), // a forked child: the parent's connections
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
    let conn = owner.wait(py, "client", Conn::open(url))?.map_err(errors::from_client)?;
    Ok(Client::new(conn, owner))
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

    /// Takes every lock of `names` (2 to 16 distinct names) at once and
    /// returns their `MultiGuard`: all of them or none. The keywords of
    /// `lock` (no `permits`, `weight` or `once_per`: read-write locks only).
    /// `Busy` (a try found one of them held) or `TimedOut` (the wait ran out)
    /// and nothing is taken; `Unsupported` where the backend has no
    /// multi-lock.
    #[pyo3(signature = (names, **options))]
    fn lock_all(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<MultiGuard> {
        let opts = lock_options(options)?;
        let outcome = self.acquire_all(py, &names, opts.clone())?;
        let all = multi::granted(&names, &opts, outcome, self.owner.clone(), true)?;
        all.ok_or_else(|| errors::error("a multi-lock raised no contention (a bug)"))
    }

    /// `lock_all`, with contention as an outcome: the `MultiGuard`, or None.
    #[pyo3(signature = (names, **options))]
    fn try_lock_all(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<MultiGuard>> {
        let opts = lock_options(options)?;
        let outcome = self.acquire_all(py, &names, opts.clone())?;
        multi::granted(&names, &opts, outcome, self.owner.clone(), false)
    }

    /// asyncio's `lock_all` (`raise_contention`) and `try_lock_all`:
    /// `done(ok, MultiGuard, None or exception)`. The `Task` withdraws the
    /// request when cancelled.
    #[pyo3(signature = (done, names, raise_contention, **options))]
    fn _start_lock_all(
        &self,
        done: Py<PyAny>,
        names: Vec<String>,
        raise_contention: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Task> {
        let opts = lock_options(options)?;
        let backend = self.backend()?;
        let owner = self.owner.clone();
        let fut = async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let out = backend.acquire_all(&refs, &opts).await;
            (names, opts, out)
        };
        self.owner.start("client", fut, done, move |py, (names, opts, out)| {
            let outcome = out.map_err(errors::from_client)?;
            let all = multi::granted(&names, &opts, outcome, owner, raise_contention)?;
            Ok(all.into_pyobject(py)?.into_any().unbind())
        })
    }

    /// Watches every lock whose name starts with `prefix` ("" = all): from
    /// the revision `from_revision` (`INDEX.SEQ`, inclusive) if given, else
    /// from the events applied after the watch opens. Nothing waits here: the
    /// client opens the watch in the background. The fencelock server's
    /// only (`Unsupported` elsewhere).
    #[pyo3(signature = (prefix, *, from_revision=None))]
    fn _watch(&self, prefix: String, from_revision: Option<String>) -> PyResult<Watcher> {
        let from = from_revision.as_deref().map(crate::args::revision).transpose()?;
        let native = self.native("watch")?;
        let rt = self.owner.rt("client")?;
        let _entered = rt.enter();
        Ok(Watcher::new(native.watch_from(prefix, from), self.owner.clone()))
    }

    /// Gives the semaphore `name` `permits` permits from now on and returns
    /// the number it had. The fencelock server's only.
    fn resize(&self, py: Python<'_>, name: String, permits: u32) -> PyResult<u32> {
        let native = self.native("resize")?;
        let out = self.owner.wait(py, "client", async move { native.resize(&name, permits).await })?;
        out.map_err(errors::from_client)
    }

    /// asyncio's `resize`: `done(ok, int or exception)`.
    fn _start_resize(&self, done: Py<PyAny>, name: String, permits: u32) -> PyResult<Task> {
        let native = self.native("resize")?;
        let fut = async move { native.resize(&name, permits).await };
        self.owner.start("client", fut, done, |py, out| {
            let was = out.map_err(errors::from_client)?;
            Ok(was.into_pyobject(py)?.into_any().unbind())
        })
    }

    /// A fence's report that it refused a stale write on `lock`: the token
    /// `refused`, below `highest` (the highest it had admitted), on
    /// `resource` (what it protects; "" for none). Every watch of the lock
    /// shows it as a `write_refused` event. The fencelock server's only.
    #[pyo3(signature = (lock, refused, highest, resource=String::new()))]
    fn report_refusal(
        &self,
        py: Python<'_>,
        lock: String,
        refused: u64,
        highest: u64,
        resource: String,
    ) -> PyResult<()> {
        let native = self.native("report_refusal")?;
        let out = self
            .owner
            .wait(py, "client", async move { native.report_refusal(&lock, refused, highest, &resource).await })?;
        out.map_err(errors::from_client)
    }

    /// asyncio's `report_refusal`: `done(ok, None or exception)`.
    #[pyo3(signature = (done, lock, refused, highest, resource=String::new()))]
    fn _start_report_refusal(
        &self,
        done: Py<PyAny>,
        lock: String,
        refused: u64,
        highest: u64,
        resource: String,
    ) -> PyResult<Task> {
        let native = self.native("report_refusal")?;
        let fut = async move { native.report_refusal(&lock, refused, highest, &resource).await };
        self.owner.start("client", fut, done, |py, out| {
            out.map_err(errors::from_client)?;
            Ok(py.None())
        })
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
        let Some(conn) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        let conn = self.owner.wait(py, "client", async move {
            conn.backend.close().await;
            conn
        })?;
        let _entered = self.owner.enter();
        drop(conn);
        Ok(())
    }

    /// asyncio's `aclose`: `done(ok, None)` once the lingering lease is
    /// revoked (the loop does not block meanwhile).
    fn _start_close(&self, done: Py<PyAny>) -> PyResult<Task> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        let fut = async move {
            if let Some(conn) = conn {
                conn.backend.close().await;
            }
        };
        self.owner.start("client", fut, done, |py, ()| Ok(py.None()))
    }

    /// [`Client::close`] without waiting (for asyncio, whose loop must not
    /// block): the lingering lease is revoked in the background.
    fn _close_later(&self) {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _entered = self.owner.enter();
        drop(conn);
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

    /// Acquires every lock of `names` at once with `opts`, waiting with the
    /// GIL released; a Ctrl-C withdraws the request.
    fn acquire_all(
        &self,
        py: Python<'_>,
        names: &[String],
        opts: LockOptions,
    ) -> PyResult<Outcome<fencelock::MultiGuard>> {
        let backend = self.backend()?;
        let names = names.to_vec();
        let out = self.owner.wait(py, "client", async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            backend.acquire_all(&refs, &opts).await
        })?;
        out.map_err(errors::from_client)
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
    let made = owner.clone();
    owner.start("client", Conn::open(url), done, move |py, out| {
        let conn = out.map_err(errors::from_client)?;
        Ok(Py::new(py, Client::new(conn, made))?.into_any())
    })
}
