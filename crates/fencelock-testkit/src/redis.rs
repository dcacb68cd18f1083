//! `redis-server`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

    fn start_with(durable: bool) -> Self {
        let mut server = RedisServer { child: None, port: free_port(), durable, dir: shared_tempdir() };
        server.spawn();
        server
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
        let mut child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
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
        wait_ready("redis-server", &mut child, &log, || redis_pid(port) == Some(pid));
        self.child = Some(child);
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
