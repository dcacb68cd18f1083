//! HTTP/1.1 on the wire, without IO: a request and its bytes, an answer and
//! its parsing from the bytes read so far. Shared by the async [`crate::Client`]
//! and [`crate::blocking`].

use crate::error::HttpError;

/// One request: method, path (with its query), extra headers and body.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// `GET path`, no headers, no body.
    pub fn get(path: &'a str) -> Self {
        Request { method: "GET", path, headers: &[], body: b"" }
    }
}

/// An answer: status, body, and the server's `Date` header (its wall clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub date: Option<String>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The request's bytes, head then body: `Host`, `Connection: close`, its
/// `Content-Length`, then the extra headers. A header value with a control
/// character (other than tab) is refused, so none can add a line.
pub(crate) fn head(host: &str, req: &Request<'_>) -> Result<Vec<u8>, HttpError> {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        req.method,
        req.path,
        req.body.len()
    );
    for (k, v) in req.headers {
        if v.chars().any(|c| c.is_control() && c != '\t') {
            return Err(HttpError::BadHeader { name: k.to_string() });
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut msg = head.into_bytes();
    msg.extend_from_slice(req.body);
    Ok(msg)
}

/// The parsed answer once `raw` holds its head and its whole body (by its
/// `Content-Length`; a chunked answer is complete only at the end of the stream).
pub(crate) fn complete(raw: &[u8]) -> Option<Result<Response, String>> {
    let end = head_end(raw)?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let len = header(head, "content-length")?.parse::<usize>().ok()?;
    (raw.len() >= end + 4 + len).then(|| parse(raw))
}

fn head_end(raw: &[u8]) -> Option<usize> {
    raw.windows(4).position(|w| w == b"\r\n\r\n")
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The answer in `raw`, which holds all that will come.
pub(crate) fn parse(raw: &[u8]) -> Result<Response, String> {
    let end = head_end(raw).ok_or("the answer ends before its head does")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "the answer's head is not UTF-8".to_string())?;
    let status_line = head.lines().next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut body = raw[end + 4..].to_vec();
    if let Some(len) = header(head, "content-length").and_then(|l| l.parse::<usize>().ok()) {
        if body.len() < len {
            return Err(format!("the body is cut short ({} of {len} bytes)", body.len()));
        }
        body.truncate(len);
    } else if header(head, "transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    }
    Ok(Response { status, body, date: header(head, "date").map(str::to_string) })
}

/// A chunked body's data; an error if it ends before its last chunk.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line = rest.windows(2).position(|w| w == b"\r\n").ok_or("a chunked body is cut short")?;
        let size = std::str::from_utf8(&rest[..line]).unwrap_or("").split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {size:?}"))?;
        rest = &rest[line + 2..];
        if n == 0 {
            return Ok(out);
        }
        if rest.len() < n + 2 {
            return Err("a chunked body is cut short".into());
        }
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer is split at its blank line and cut to its Content-Length; a
    /// short one is an error, never a silently shorter body.
    #[test]
    fn parses_status_body_and_date() {
        let r = parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\ndate: Sun, 22 Nov 2026 10:00:00 GMT\r\n\r\nokXX")
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (409, &b"ok"[..]));
        assert_eq!(r.date.as_deref(), Some("Sun, 22 Nov 2026 10:00:00 GMT"));
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok").unwrap_err().contains("cut short"));
        assert!(parse(b"HTTP/1.1 200").unwrap_err().contains("ends before its head"));
        assert!(parse(b"HTTP/1.1 abc\r\n\r\n").unwrap_err().contains("bad status line"));
    }

    /// A chunked answer is de-chunked; one cut short is an error.
    #[test]
    fn dechunks_and_refuses_a_cut_chunked_body() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse(raw).unwrap().body, b"abcde");
        let cut = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab";
        assert!(parse(cut).unwrap_err().contains("cut short"));
    }

    /// The request carries Host, Connection: close, its Content-Length and
    /// the extra headers, then the body; a header value that would add a
    /// line is refused without being quoted.
    #[test]
    fn the_request_head_is_complete() {
        let headers = [("Authorization", "Bearer t".to_string())];
        let req = Request { method: "POST", path: "/v1/auth", headers: &headers, body: b"{}" };
        let text = String::from_utf8(head("127.0.0.1:7071", &req).unwrap()).unwrap();
        assert_eq!(
            text,
            "POST /v1/auth HTTP/1.1\r\nHost: 127.0.0.1:7071\r\nConnection: close\r\nContent-Length: 2\r\nAuthorization: Bearer t\r\n\r\n{}"
        );
        let headers = [("X-Token", "sekrit\r\nX-Admin: yes".to_string())];
        let err = head("h:1", &Request { headers: &headers, ..Request::get("/") }).unwrap_err();
        assert!(matches!(err, HttpError::BadHeader { .. }) && !err.to_string().contains("sekrit"), "{err}");
    }
}
