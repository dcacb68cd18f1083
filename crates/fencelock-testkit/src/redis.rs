//! `redis-server`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::fs;

use crate::certs::TestCerts;
use crate::{free_port, shared_tempdir, wait_ready, which, INSTALL_HINT};

/// A `redis-server`. [`RedisServer::start`] runs it with AOF on and
/// `appendfsync always`, so that an acknowledged write survives SIGKILL;
/// [`RedisServer::start_volatile`] with no persistence at all (Redis's common
/// cache set-up, and the fastest).
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    durable: bool,
    dir: tempfile::TempDir,
    security: RedisSecurity,
    certs: Option<TestCerts>,
}

/// What a secured server asks of its clients ([`RedisServer::start_secure`]).
#[derive(Debug, Clone, Default)]
pub struct RedisSecurity {
    /// TLS only: the plaintext port is off (`--port 0`), the server listens
    /// with `--tls-port` on a certificate of a fresh test CA; clients need no
    /// certificate (`--tls-auth-clients no`).
    pub tls: bool,
    /// An ACL user `(name, password)` with every permission; the `default`
    /// user is off, so a client must log in.
    pub user: Option<(String, String)>,
}

impl RedisServer {
    /// A fresh durable server (AOF, `appendfsync always`, no RDB snapshots),
    /// answering PING.
    pub fn start() -> Self {
        Self::start_with(true)
    }

    /// A fresh server without AOF and without RDB snapshots.
    pub fn start_volatile() -> Self {
        Self::start_with(false)
    }

    /// A fresh volatile server with TLS and/or an ACL user (see
    /// [`RedisSecurity`]).
    pub fn start_secure(security: RedisSecurity) -> Self {
        let certs = security.tls.then(|| TestCerts::new("redis"));
        let mut server =
            RedisServer { child: None, port: free_port(), durable: false, dir: shared_tempdir(), security, certs };
        server.spawn();
        server
    }

    fn start_with(durable: bool) -> Self {
        let security = RedisSecurity::default();
        let mut server =
            RedisServer { child: None, port: free_port(), durable, dir: shared_tempdir(), security, certs: None };
        server.spawn();
        server
    }

    /// How the server runs, in one line (for a report). Tests and the bench
    /// run Redis alike: its defaults are already what an operator runs (log
    /// level `notice`, nothing per command).
    pub fn describe(&self) -> String {
        let persistence = match self.durable {
            true => "appendonly yes, appendfsync always (fsync before each reply)",
            false => "no AOF",
        };
        format!("{persistence}, no RDB snapshots (save \"\"), loglevel notice (the default) to a file")
    }

    /// The test CA and certificates of a TLS server.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL the server (no chance to write anything more), then start it
    /// again on the same port and data directory.
    pub fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    fn spawn(&mut self) {
        let bin = which("redis-server").unwrap_or_else(|| panic!("redis-server not found: {INSTALL_HINT}"));
        let log = self.dir.path().join("redis.log");
        let appendonly = if self.durable { "yes" } else { "no" };
        let mut command = Command::new(bin);
        command.args(["--bind", "127.0.0.1"]).args(self.listen_args());
        if let Some((user, password)) = &self.security.user {
            command.args(["--user", user, "on", &format!(">{password}"), "~*", "&*", "+@all"]);
            command.args(["--user", "default", "off"]);
        }
        let mut child = command
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args(["--appendonly", appendonly, "--appendfsync", "always", "--save", ""])
            .args(["--daemonize", "no", "--protected-mode", "no", "--maxclients", "10000"])
            .args(["--logfile", log.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {INSTALL_HINT}"));
        let (port, pid) = (self.port, child.id());
        if self.certs.is_some() || self.security.user.is_some() {
            // No plaintext INFO to ask: the log says when it listens.
            let ready = || fs::read_to_string(&log).is_ok_and(|l| l.contains("Ready to accept connections"));
            wait_ready("redis-server", &mut child, &log, ready);
        } else {
            wait_ready("redis-server", &mut child, &log, || redis_pid(port) == Some(pid));
        }
        self.child = Some(child);
    }

    /// `--port P`, or for TLS `--port 0 --tls-port P` and the certificate files.
    fn listen_args(&self) -> Vec<String> {
        let port = self.port.to_string();
        let Some(certs) = &self.certs else {
            return vec!["--port".into(), port];
        };
        let path = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port,
            "--tls-cert-file".into(),
            path(certs.server_cert()),
            "--tls-key-file".into(),
            path(certs.server_key()),
            "--tls-ca-cert-file".into(),
            path(certs.ca()),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

/// The `process_id` of the Redis server answering on `port`: ready, and ours
/// (not another test's server that took the port).
fn redis_pid(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    text.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|v| v.trim().parse().ok())
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
