//! The client's blocking variant, for code that runs outside an async
//! runtime or must not enter it (the testkit's readiness checks, which run
//! inside the tests' runtimes): plain HTTP to an address, one request per
//! connection, the same bytes on the wire as [`crate::Client`].

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::HttpError;
use crate::url::Endpoint;
use crate::wire::{self, Request, Response};

/// Sends `req` to `addr` and reads the whole answer; connecting, and each
/// read and write, within `timeout` (no clock is read: a peer that trickles
/// bytes can take longer in all).
pub fn send(addr: SocketAddr, req: Request<'_>, timeout: Duration) -> Result<Response, HttpError> {
    let to = Endpoint::from(addr);
    let msg = wire::head(&to.to_string(), &req)?;
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|source| HttpError::Connect { addr: to.clone(), source })?;
    let failed = |source: io::Error| match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            HttpError::Timeout { addr: to.clone(), method: req.method.into(), path: req.path.into(), timeout }
        }
        _ => HttpError::Io { addr: to.clone(), method: req.method.into(), path: req.path.into(), source },
    };
    s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).map_err(failed)?;
    s.write_all(&msg).map_err(failed)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(r) = wire::complete(&raw) {
            return r.map_err(|reason| HttpError::Malformed { addr: to.clone(), reason });
        }
        let n = s.read(&mut buf).map_err(failed)?;
        if n == 0 {
            return wire::parse(&raw).map_err(|reason| HttpError::Malformed { addr: to.clone(), reason });
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a real socket, from a plain thread: the answer is read to its
    /// Content-Length; a closed port is a connect error.
    #[test]
    fn gets_an_answer_without_a_runtime() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{\"health\":\"true\"}").unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let r = send(addr, Request::get("/health"), Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.text()), (200, "{\"health\":\"true\"}".to_string()));
        assert!(server.join().unwrap().starts_with("GET /health HTTP/1.1\r\n"));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let err = send(closed, Request::get("/"), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, HttpError::Connect { .. }), "{err}");
    }
}
