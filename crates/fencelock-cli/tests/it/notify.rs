//! Issue 37 §1: `fencelock serve` speaks systemd's readiness protocol, so that
//! a unit of `Type=notify` (packaging/fencelock.service) is started when the
//! node serves and not before.
//!
//! Rules: with `NOTIFY_SOCKET` set, the node sends `READY=1` (with a `STATUS=`
//! naming its addresses) once its ports accept connections, a node that waits
//! to be added (`--join`) included, and nothing more while it serves; SIGTERM
//! makes it send `STOPPING=1` and exit 0. Each node here gets a datagram
//! socket of its own in a temp dir as `NOTIFY_SOCKET`, as systemd sets it; the
//! package's test (`package.rs`) runs the installed binary with an abstract
//! one (`@name`).

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{bin, free_port, http_get};

/// How long a message may take: this many polls of [`POLL`] (30 s in all, a
/// bound for a loaded 2-core machine, not a timing).
const POLLS: u32 = 300;
const POLL: Duration = Duration::from_millis(100);

/// A `fencelock serve` whose `NOTIFY_SOCKET` is `socket`. Killed on drop.
struct Node {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    log: PathBuf,
    socket: UnixDatagram,
}

impl Node {
    fn start(dir: &Path, name: &str, flags: &[&str]) -> Node {
        let socket_path = dir.join(format!("{name}.notify"));
        let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
        socket.set_read_timeout(Some(POLL)).unwrap();
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(bin())
            .args(["serve", "--data-dir"])
            .arg(dir.join(format!("{name}.data")))
            .args(["--listen", &grpc.to_string(), "--http", &http.to_string()])
            .args(flags)
            .env("NOTIFY_SOCKET", &socket_path)
            .env("FENCELOCK_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn fencelock serve");
        Node { child, grpc, http, log, socket }
    }

    /// The next message on the socket, within [`POLLS`]; fails if the node
    /// exits first.
    fn receive(&mut self, what: &str) -> String {
        let mut buf = [0u8; 4096];
        for _ in 0..POLLS {
            match self.socket.recv(&mut buf) {
                Ok(n) => return String::from_utf8_lossy(&buf[..n]).into_owned(),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("receiving {what}: {e}"),
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the node exited ({status}) before it sent {what}; log:\n{}", self.log_text());
            }
        }
        panic!("no {what} within {POLLS} polls of {POLL:?}; log:\n{}", self.log_text());
    }

    /// Whether a message is waiting on the socket (without waiting for one).
    fn has_message(&self) -> bool {
        self.socket.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let got = self.socket.recv(&mut buf).is_ok();
        self.socket.set_nonblocking(false).unwrap();
        got
    }

    /// `READY=1` arrives, and both ports accept a connection at once.
    fn expect_ready(&mut self) {
        let msg = self.receive("READY=1");
        let lines: Vec<&str> = msg.lines().collect();
        assert_eq!(lines.first(), Some(&"READY=1"), "{msg:?}");
        let status = format!("serving gRPC on {} and HTTP on {}", self.grpc, self.http);
        assert!(lines.iter().any(|l| l.starts_with("STATUS=") && l.ends_with(&status)), "{msg:?}");
        TcpStream::connect(self.grpc).expect("the gRPC port accepts once READY=1 is sent");
        let (code, _) = http_get(self.http, "/healthz").expect("the admin port answers once READY=1 is sent");
        assert!(code == 200 || code == 503, "{code}");
    }

    /// SIGTERM: `STOPPING=1` arrives and the node exits 0.
    fn expect_stopping_on_sigterm(&mut self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let msg = self.receive("STOPPING=1");
        assert_eq!(msg.lines().next(), Some("STOPPING=1"), "{msg:?}");
        for _ in 0..POLLS {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status}; log:\n{}", self.log_text());
                return;
            }
            std::thread::sleep(POLL);
        }
        panic!("the node did not exit within {POLLS} polls after SIGTERM; log:\n{}", self.log_text());
    }

    /// `/healthz` answers 200 (this node leads) within [`POLLS`].
    fn expect_healthy(&self) {
        for _ in 0..POLLS {
            if let Ok((200, _)) = http_get(self.http, "/healthz") {
                return;
            }
            std::thread::sleep(POLL);
        }
        panic!("not healthy within {POLLS} polls; log:\n{}", self.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node that forms a group of one: `READY=1` once its ports accept, nothing
/// more while it serves, `STOPPING=1` on SIGTERM.
#[test]
fn ready_once_serving_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path(), "single", &[]);
    node.expect_ready();
    node.expect_healthy();
    assert!(!node.has_message(), "a second message while serving");
    node.expect_stopping_on_sigterm();
}

/// A node that waits to be added to a group (`--join`, no leader, `/healthz`
/// 503) serves its ports all the same: it is ready too, or `systemctl start`
/// would wait for a `fencelock cluster add` that needs it started.
#[test]
fn a_node_waiting_to_join_is_ready_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path(), "joiner", &["--join", "--node-id", "2"]);
    node.expect_ready();
    assert_eq!(http_get(node.http, "/healthz").unwrap().0, 503, "a node waiting to join leads nothing");
    node.expect_stopping_on_sigterm();
}
