//! systemd's readiness protocol (`sd_notify(3)`), without a crate: how
//! `fencelock serve` tells a service manager that it serves and that it stops.
//!
//! Where it sits: [`crate::serve`] calls [`ready`] once the node's listeners
//! accept connections and its servers run (storage open, Raft started: a
//! leader, a follower and a node that waits to be added alike, since each of
//! them answers clients from then on), and [`stopping`] when SIGTERM or SIGINT
//! asks it to stop, before it finishes what is in flight. The Debian package's
//! unit (`packaging/fencelock.service`) is `Type=notify`: `systemctl start`
//! returns when the node sends `READY=1`, and a unit started after
//! `fencelock.service` finds the ports open.
//!
//! The protocol: the manager sets `NOTIFY_SOCKET` to a datagram socket, a
//! path (`/run/systemd/notify`) or an abstract name written `@name`, and the
//! service sends it newline-separated `KEY=value` lines. Without
//! `NOTIFY_SOCKET` (a node run by hand, by a test, in a container) nothing
//! is sent. A message that cannot be sent is logged and ignored: a node that
//! serves keeps serving (systemd then stops it at `TimeoutStartSec`, which
//! says why better than a node that exits would).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The environment variable that names the manager's socket.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Tell the manager the node serves: `READY=1`, and `status` (one line,
/// e.g. the addresses) as the `STATUS=` that `systemctl status` shows.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={}\n", one_line(status)));
}

/// Tell the manager the node is shutting down: `STOPPING=1`.
pub fn stopping() {
    notify("STOPPING=1\nSTATUS=shutting down\n");
}

/// Send `state` to `NOTIFY_SOCKET`, if it is set; a failure is logged.
fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET).filter(|s| !s.is_empty()) else { return };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(socket = %socket.to_string_lossy(), error = %e, "cannot notify the service manager");
    }
}

/// Send `state` as one datagram to the socket `socket` names (a path, or
/// `@name` for an abstract socket).
fn send(socket: &OsStr, state: &str) -> io::Result<()> {
    let addr = address(socket)?;
    let sent = UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(io::Error::other(format!("sent {sent} of {} bytes", state.len())));
    }
    Ok(())
}

/// The address `NOTIFY_SOCKET` names: `@name` is the abstract socket `name`,
/// an absolute path a socket file; anything else (a relative path, systemd's
/// `vsock:` addresses) is not supported.
fn address(socket: &OsStr) -> io::Result<SocketAddr> {
    let bytes = socket.as_bytes();
    match bytes.first() {
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(&bytes[1..])
        }
        Some(b'/') => SocketAddr::from_pathname(socket),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET is neither an absolute path nor an abstract name (@…)",
        )),
    }
}

/// `s` with line breaks replaced, so that it stays one `STATUS=` line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn receive(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// A socket file named by its absolute path gets the message as one
    /// datagram, unchanged.
    #[test]
    fn sends_to_a_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=x\n").unwrap();
        assert_eq!(receive(&sock), "READY=1\nSTATUS=x\n");
    }

    /// `@name` is the abstract socket `name` (no file, no leading NUL written).
    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("fencelock-notify-test-{}", std::process::id());
        let sock = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        send(OsStr::new(&format!("@{name}")), "STOPPING=1\n").unwrap();
        assert_eq!(receive(&sock), "STOPPING=1\n");
    }

    /// A relative path or another scheme is refused, and a socket nobody
    /// listens on is an error (which [`notify`] logs, and serving goes on).
    #[test]
    fn unsupported_and_missing_sockets_are_errors() {
        for bad in ["notify", "vsock:2:1234", ""] {
            let e = send(OsStr::new(bad), "READY=1\n").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(send(dir.path().join("nobody").as_os_str(), "READY=1\n").is_err());
    }

    #[test]
    fn the_status_stays_one_line() {
        assert_eq!(one_line("a\nb\r\nc"), "a b  c");
    }
}
