//! `etcd` (Debian's etcd-server, v3 API).

use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::certs::TestCerts;
use crate::{free_port, shared_tempdir, stop_child, wait_ready, which, Profile, INSTALL_HINT};

/// A single-member etcd cluster; data is fsynced as etcd always does. In the
/// test profile its Raft timers are shortened (heartbeat 20 ms, election
/// 200 ms), which also lowers etcd's minimum lease TTL to one second, and it
/// logs warnings; in the production profile it keeps etcd's defaults
/// (heartbeat 100 ms, election 1 s: leases of 2 s and more) and logs at
/// etcd's default level (info: start-up, elections, compactions; nothing
/// per request).
pub struct EtcdServer {
    child: Option<Child>,
    port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    certs: Option<TestCerts>,
    token_ttl_secs: u32,
    profile: Profile,
}

impl EtcdServer {
    /// Starts a fresh member and waits until `/health` says it has a leader.
    pub fn start() -> Self {
        Self::start_with(None, 300, Profile::Test)
    }

    /// Starts a fresh member in `profile` and waits until it has a leader.
    pub fn start_profile(profile: Profile) -> Self {
        Self::start_with(None, 300, profile)
    }

    /// How the member runs, in one line (for a report).
    pub fn describe(&self) -> String {
        format!("{}; WAL fsynced per commit (always, in etcd)", self.tuning_args().join(" "))
    }

    /// Starts a fresh member that serves clients over TLS only (`https`
    /// client URL, a server certificate of a fresh test CA, no client
    /// certificate asked), with simple auth tokens that expire after
    /// `token_ttl_secs` idle seconds once auth is enabled (auth itself is
    /// enabled by the test, through the gRPC Auth API).
    pub fn start_tls(token_ttl_secs: u32) -> Self {
        Self::start_with(Some(TestCerts::new("etcd")), token_ttl_secs, Profile::Test)
    }

    fn start_with(certs: Option<TestCerts>, token_ttl_secs: u32, profile: Profile) -> Self {
        let (port, peer_port, dir) = (free_port(), free_port(), shared_tempdir());
        let mut server = EtcdServer { child: None, port, peer_port, dir, certs, token_ttl_secs, profile };
        server.spawn();
        server
    }

    /// The test CA and certificates of a TLS member.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, then start again on the same ports and data.
    pub fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    fn spawn(&mut self) {
        let bin = which("etcd").unwrap_or_else(|| panic!("etcd not found: {INSTALL_HINT}"));
        let log_path = self.dir.path().join("etcd.log");
        let log = File::options().create(true).append(true).open(&log_path).unwrap();
        let scheme = if self.certs.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(bin);
        if let Some(certs) = &self.certs {
            command.arg("--cert-file").arg(certs.server_cert()).arg("--key-file").arg(certs.server_key());
        }
        let mut child = command
            .args(["--name", "t", "--data-dir", self.dir.path().join("data").to_str().unwrap()])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}"), "--initial-cluster-state", "new"])
            .args(self.tuning_args())
            .args(["--logger", "zap"])
            .args(["--auth-token-ttl", &self.token_ttl_secs.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({e}): {INSTALL_HINT}"));
        let port = self.port;
        if self.certs.is_some() {
            // No plaintext /health to ask: the log says when it serves.
            let ready = || fs::read_to_string(&log_path).is_ok_and(|l| l.contains("serving client traffic securely"));
            wait_ready("etcd", &mut child, &log_path, ready);
        } else {
            wait_ready("etcd", &mut child, &log_path, || etcd_healthy(port));
        }
        self.child = Some(child);
    }
}

impl EtcdServer {
    /// Raft timers and log level: the test profile's short timers (a TLS
    /// member logs at info, for the line that says it serves), or etcd's defaults.
    fn tuning_args(&self) -> Vec<String> {
        let args: &[&str] = match self.profile {
            Profile::Test if self.certs.is_some() => {
                &["--heartbeat-interval", "20", "--election-timeout", "200", "--log-level", "info"]
            }
            Profile::Test => &["--heartbeat-interval", "20", "--election-timeout", "200", "--log-level", "warn"],
            Profile::Production => {
                &["--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "info"]
            }
        };
        args.iter().map(|a| a.to_string()).collect()
    }
}

/// Whether the member's plaintext `/health` says it has a leader (blocking:
/// it runs inside the tests' runtimes).
fn etcd_healthy(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let get = fencelock_http::Request::get("/health");
    fencelock_http::blocking::send(addr, get, Duration::from_secs(5))
        .is_ok_and(|r| r.text().contains("\"health\":\"true\""))
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL, 500);
        }
    }
}
