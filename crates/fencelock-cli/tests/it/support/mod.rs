//! Test support: real `fencelock` processes on free ports of 127.0.0.1, with data
//! in temp dirs, and a minimal HTTP/1.1 GET for the admin endpoint (over TLS:
//! [`secure`]).
#![allow(dead_code)]
// Tests wait for processes by the clock; no lease logic lives here.
#![allow(clippy::disallowed_methods)]

pub mod cluster;
pub mod netns;
pub mod secure;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// The `fencelock` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fencelock")
}

pub use fencelock_testkit::free_port;

/// An id or token of the admin port's JSON (a decimal string there; a
/// number in the CLI's `--json` output), as a number.
pub fn id(v: &serde_json::Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64())
}

/// A `fencelock serve` process. Killed (SIGKILL) on drop.
pub struct Server {
    pub dir: PathBuf,
    /// The server's data directory (by default `dir/data`).
    pub data: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
    /// Extra `fencelock serve` flags.
    flags: Vec<String>,
    /// The process's descriptor limit (soft and hard), if set.
    nofile: Option<u64>,
    /// Extra environment of every start.
    env: Vec<(String, String)>,
}

impl Server {
    /// Start a server on free ports with its data in `dir`, and wait until healthy.
    pub fn start(dir: &Path) -> Server {
        Self::start_with_data(dir, &dir.join("data"))
    }

    /// Like [`Server::start`], with the data directory somewhere else.
    pub fn start_with_data(dir: &Path, data: &Path) -> Server {
        Self::launch(dir, data, &[], None)
    }

    /// Like [`Server::start_with_data`], with extra `fencelock serve` flags.
    pub fn start_with_data_and_flags(dir: &Path, data: &Path, flags: &[&str]) -> Server {
        Self::launch(dir, data, flags, None)
    }

    /// Like [`Server::start`], with extra `fencelock serve` flags and, if
    /// `nofile` is set, that limit on the process's open descriptors.
    pub fn start_with_flags(dir: &Path, flags: &[&str], nofile: Option<u64>) -> Server {
        Self::launch(dir, &dir.join("data"), flags, nofile)
    }

    /// Like [`Server::start`], with extra environment variables (kept for
    /// restarts).
    pub fn start_with_env(dir: &Path, env: &[(&str, &str)]) -> Server {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self::launch_with(dir, &dir.join("data"), &[], None, env)
    }

    fn launch(dir: &Path, data: &Path, flags: &[&str], nofile: Option<u64>) -> Server {
        Self::launch_with(dir, data, flags, nofile, Vec::new())
    }

    fn launch_with(dir: &Path, data: &Path, flags: &[&str], nofile: Option<u64>, env: Vec<(String, String)>) -> Server {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut s = Server {
            dir: dir.to_path_buf(),
            data: data.to_path_buf(),
            grpc,
            http,
            child: None,
            log: dir.join("server.log"),
            flags: flags.iter().map(|f| f.to_string()).collect(),
            nofile,
            env,
        };
        s.spawn();
        s
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.dir).expect("mkdir");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log");
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--data-dir"])
            .arg(&self.data)
            .args(["--listen", &self.grpc.to_string(), "--http", &self.http.to_string()])
            .args(&self.flags)
            .env("FENCELOCK_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(n) = self.nofile {
            limit_descriptors(&mut cmd, n);
        }
        let child = cmd.spawn().expect("spawn fencelock serve");
        self.child = Some(child);
        self.wait_healthy(Duration::from_secs(20));
    }

    /// Wait until `/healthz` answers 200.
    pub fn wait_healthy(&self, within: Duration) {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Ok((200, _)) = http_get(self.http, "/healthz") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server not healthy within {within:?}; log:\n{}", self.log_text());
    }

    /// SIGKILL the server (no shutdown of any kind) and reap it.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// SIGKILL, then start again on the same ports and data dir.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        child_running(&mut self.child)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Start `cmd` with at most `n` open descriptors (`RLIMIT_NOFILE`, soft and hard).
pub fn limit_descriptors(cmd: &mut Command, n: u64) {
    use nix::sys::resource::{setrlimit, Resource};
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec, only setrlimit (async-signal-safe) runs.
    unsafe {
        cmd.pre_exec(move || setrlimit(Resource::RLIMIT_NOFILE, n, n).map_err(std::io::Error::from));
    }
}

/// Raise this process's soft descriptor limit to at least `n` (up to the hard
/// limit), for tests that hold many sockets.
pub fn raise_own_descriptor_limit(n: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < n {
        setrlimit(Resource::RLIMIT_NOFILE, n.min(hard), hard).expect("setrlimit");
    }
}

/// SIGKILL `child` (no shutdown of any kind), if any, and reap it.
pub fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Whether `child` is still running (it has not exited or crashed).
pub fn child_running(child: &mut Option<Child>) -> bool {
    child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
}

/// A `fencelock storage` process (the fenced object store). Killed on drop.
pub struct Storage {
    pub addr: SocketAddr,
    child: Child,
}

impl Storage {
    pub fn start(dir: &Path) -> Storage {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new(bin())
            .args(["storage", "--data-dir"])
            .arg(dir)
            .args(["--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fencelock storage");
        let start = Instant::now();
        while !matches!(http_get(addr, "/healthz"), Ok((200, _))) {
            assert!(start.elapsed() < Duration::from_secs(20), "storage server not healthy");
            std::thread::sleep(Duration::from_millis(20));
        }
        Storage { addr, child }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run `fencelock ARGS…` against `server` and wait for it.
pub fn cli(server: &Server, args: &[&str]) -> Output {
    Command::new(bin()).args(args).env("FENCELOCK_SERVER", server.url()).output().expect("run fencelock")
}

/// `fencelock ARGS…` against `server`, with `FENCELOCK_AUTH_TOKEN` = `token`
/// (if any; never one from the test's own environment).
pub fn fencelock_at(server: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).env("FENCELOCK_SERVER", server).env_remove("FENCELOCK_AUTH_TOKEN");
    if let Some(t) = token {
        cmd.env("FENCELOCK_AUTH_TOKEN", t);
    }
    cmd.output().expect("run fencelock")
}

/// `fencelock acquire NAME --json` (TTL 120 s) as `identity`: (token, lease).
pub fn acquire_at(server: &str, token: Option<&str>, name: &str, identity: &str) -> (u64, u64) {
    let out = fencelock_at(server, token, &["acquire", name, "--ttl", "120s", "--identity", identity, "--json"]);
    assert!(out.status.success(), "acquire {name}: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["token"].as_u64().unwrap(), v["lease_id"].as_u64().unwrap())
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `GET path` over HTTP/1.1 with `Connection: close`: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "GET", path, &[], b"")
}

/// One HTTP/1.1 request with `Connection: close`: (status, body).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    exchange(s, addr, method, path, headers, body)
}

/// Sends one request with `Connection: close` on `s` (plain or TLS) and reads
/// the answer to the end: (status, body). An end without TLS's close_notify
/// after the answer is not an error.
pub fn exchange(
    mut s: impl Read + Write,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        other => {
            other?;
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, dechunk(&body)))
}

/// Undo `Transfer-Encoding: chunked` if the body looks chunked.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, tail)) = rest.split_once("\r\n") else { return body.to_string() };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { return body.to_string() };
        if n == 0 {
            return out;
        }
        if tail.len() < n {
            return body.to_string();
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
}
