//! ZooKeeper (Debian's zookeeper package), standalone.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::{free_port, shared_tempdir, stop_child, wait_ready, which, INSTALL_HINT};

/// Where Debian puts the server's jar (its manifest names the dependencies).
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A standalone ZooKeeper server: `tickTime` 100 ms, so sessions of 200 ms to
/// 60 s are allowed; no per-host connection limit (`maxClientCnxns=0`);
/// `forceSync` on (the default: transactions are fsynced before they are
/// acknowledged).
pub struct ZkServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl ZkServer {
    /// Starts a fresh server and waits until it serves (`srvr` answers a mode).
    pub fn start() -> Self {
        let mut server = ZkServer { child: None, port: free_port(), dir: shared_tempdir() };
        server.spawn();
        server
    }

    /// `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, then start again on the same port and data.
    pub fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    fn spawn(&mut self) {
        let java = which("java").unwrap_or_else(|| panic!("java not found: {INSTALL_HINT}"));
        assert!(Path::new(ZK_JAR).exists(), "{ZK_JAR} not found: {INSTALL_HINT}");
        let dir = self.dir.path();
        let cfg = dir.join("zoo.cfg");
        fs::write(
            &cfg,
            format!(
                "tickTime=100\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\n\
                 admin.enableServer=false\nminSessionTimeout=200\nmaxSessionTimeout=60000\n\
                 4lw.commands.whitelist=srvr,ruok\n",
                dir.join("data").display(),
                self.port
            ),
        )
        .unwrap();
        let log_path = dir.join("zookeeper.log");
        let log = File::options().create(true).append(true).open(&log_path).unwrap();
        let mut child = Command::new(java)
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-cp", &format!("/etc/zookeeper/conf:{ZK_JAR}")])
            .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
            .args(["org.apache.zookeeper.server.ZooKeeperServerMain", cfg.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start ZooKeeper ({e}): {INSTALL_HINT}"));
        let port = self.port;
        wait_ready("zookeeper", &mut child, &log_path, || zk_serving(port));
        self.child = Some(child);
    }
}

fn zk_serving(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    // Short: a server that accepted before it serves answers nothing, and the
    // next poll asks again.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
    let mut reply = String::new();
    stream.write_all(b"srvr").is_ok() && stream.read_to_string(&mut reply).is_ok() && reply.contains("Mode:")
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL, 500);
        }
    }
}
