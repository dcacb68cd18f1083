//! The framed session protocol: the `Session` stream of `fencelock.v1.Lock`
//! without HTTP/2 and gRPC around it, for the native client's hot path
//! (issue 38 §1). Pure encoding and decoding, no IO: the server's
//! `framed` module and the client's `mux` use these, so that the format
//! has one definition.
//!
//! # The wire
//! On the gRPC port, in plaintext: the client opens a TCP connection and
//! sends [`PREFACE`] and a [`Kind::Hello`] frame. The server tells it from an
//! HTTP/2 connection by the preface's first byte (HTTP/2's own preface begins
//! `PRI `), answers with [`PREFACE`] and [`Kind::Ready`], or [`Kind::Close`]
//! if the hello is refused, and from then on the stream is the `Session`
//! call's, one message per [`Kind::Message`] frame: `SessionRequest`s from
//! the client, `SessionResponse`s from the server, matched by `op_id`, any
//! number in flight. A server that does not speak it (an older fencelock, an
//! HTTP/2 proxy) answers with something other than [`PREFACE`] or closes the
//! connection, and the client uses the gRPC `Session` call instead.
//!
//! Every frame is `length: u32 big-endian | kind: u8 | body`, where `length`
//! counts the kind byte and the body and is at most [`MAX_FRAME`]:
//! - `Hello` (client): the value of the `authorization` header a gRPC call
//!   would carry (`Bearer <token>`), or empty for none;
//! - `Ready` (server): empty;
//! - `Message` (both): one protobuf message;
//! - `Ping` (client) and `Pong` (server, one per ping): any 8 bytes, echoed,
//!   so that a client sees a dead connection as HTTP/2's keep-alive pings let
//!   it see one;
//! - `Close` (server, last): why the server ends the stream, as a gRPC status:
//!   `code: i32 big-endian | message (UTF-8)`.
//!
//! A frame of another kind, a longer one, or a message that does not decode
//! ends the connection with a `Close` saying so.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// What a client sends first, and the server answers first: `FLK` and the
/// protocol's version. Not an HTTP/2 preface (`PRI * HTTP/2.0…`) nor an HTTP/1
/// request line, so the server tells them apart by the first byte.
pub const PREFACE: [u8; 8] = *b"FLKSESS1";

/// The largest frame's `length` (kind byte and body): a request message of
/// the gRPC API's limit (64 KiB, `MAX_REQUEST_BYTES` in the server), and the
/// kind byte.
pub const MAX_FRAME: usize = 64 * 1024 + 1;

/// Bytes before a frame's body: its length and its kind.
pub const HEADER: usize = 5;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Ready = 2,
    Message = 3,
    Ping = 4,
    Pong = 5,
    Close = 6,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Ready,
            3 => Kind::Message,
            4 => Kind::Ping,
            5 => Kind::Pong,
            6 => Kind::Close,
            _ => return None,
        })
    }
}

/// A frame that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// `length` beyond [`MAX_FRAME`] (or zero: no kind byte).
    Length(usize),
    /// A kind byte this version does not know.
    Kind(u8),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Length(n) => write!(f, "a frame of {n} bytes (1 to {MAX_FRAME})"),
            FrameError::Kind(k) => write!(f, "a frame of unknown kind {k}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Appends a frame of `kind` whose body is `body`.
pub fn put(out: &mut BytesMut, kind: Kind, body: &[u8]) {
    out.reserve(HEADER + body.len());
    out.put_u32((body.len() + 1) as u32);
    out.put_u8(kind as u8);
    out.put_slice(body);
}

/// Appends a [`Kind::Message`] frame of `m`.
pub fn put_message(out: &mut BytesMut, m: &impl prost::Message) {
    let len = m.encoded_len();
    out.reserve(HEADER + len);
    out.put_u32((len + 1) as u32);
    out.put_u8(Kind::Message as u8);
    // Cannot fail: the room was reserved above.
    let _ = m.encode(out);
}

/// Appends a [`Kind::Close`] frame of a gRPC status `code` and `message`.
pub fn put_close(out: &mut BytesMut, code: i32, message: &str) {
    // A message is cut (at a character boundary) to fit in a frame.
    let mut end = message.len().min(MAX_FRAME - 1 - 4);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut body = Vec::with_capacity(4 + end);
    body.extend_from_slice(&code.to_be_bytes());
    body.extend_from_slice(&message.as_bytes()[..end]);
    put(out, Kind::Close, &body);
}

/// A [`Kind::Close`] frame's code and message (a short body: `UNKNOWN`).
pub fn close_of(body: &[u8]) -> (i32, String) {
    match body.split_first_chunk::<4>() {
        Some((code, message)) => (i32::from_be_bytes(*code), String::from_utf8_lossy(message).into_owned()),
        None => (2, "a close frame without a status".into()),
    }
}

/// Takes the first whole frame off `buf`: `Ok(None)` until one has fully
/// arrived. A bad length or kind is an error at once, before its body is
/// waited for.
pub fn next(buf: &mut BytesMut) -> Result<Option<(Kind, Bytes)>, FrameError> {
    let Some(head) = buf.first_chunk::<HEADER>() else { return Ok(None) };
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(FrameError::Length(len));
    }
    let kind = Kind::of(head[4]).ok_or(FrameError::Kind(head[4]))?;
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(HEADER);
    Ok(Some((kind, buf.split_to(len - 1).freeze())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{session_request::Op, ReleaseRequest, SessionRequest};

    /// Rule: a frame put is the frame taken, whole, however its bytes arrive
    /// (one at a time here), and not before its last byte.
    #[test]
    fn a_frame_is_taken_whole_once_it_has_arrived() {
        let m = SessionRequest {
            op_id: 7,
            op: Some(Op::Release(ReleaseRequest { request_id: 9, lease_id: 3, lock: "a".into(), token: 11 })),
        };
        let mut wire = BytesMut::new();
        put_message(&mut wire, &m);
        put(&mut wire, Kind::Ping, b"12345678");
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = next(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, Kind::Message);
        assert_eq!(<SessionRequest as prost::Message>::decode(got[0].1.clone()).unwrap(), m);
        assert_eq!(got[1], (Kind::Ping, Bytes::from_static(b"12345678")));
        assert!(buf.is_empty());
    }

    /// Rule: a length beyond the limit, a zero length or an unknown kind is
    /// an error as soon as the header is there, so that nothing waits for (or
    /// buffers) the body of a frame that will be refused.
    #[test]
    fn a_bad_header_is_refused_before_its_body() {
        let header = |len: u32, kind: u8| {
            let mut b = BytesMut::new();
            b.put_u32(len);
            b.put_u8(kind);
            b
        };
        assert_eq!(next(&mut header(MAX_FRAME as u32 + 1, 3)), Err(FrameError::Length(MAX_FRAME + 1)));
        assert_eq!(next(&mut header(0, 3)), Err(FrameError::Length(0)));
        assert_eq!(next(&mut header(10, 0)), Err(FrameError::Kind(0)));
        assert_eq!(next(&mut header(10, 7)), Err(FrameError::Kind(7)));
        assert_eq!(next(&mut header(MAX_FRAME as u32, 3)), Ok(None), "the longest frame waits for its body");
    }

    /// Rule: a close frame carries a gRPC code and message, cut to fit a
    /// frame at a character boundary; a body too short for a code reads as
    /// UNKNOWN.
    #[test]
    fn a_close_frame_says_why() {
        let mut out = BytesMut::new();
        put_close(&mut out, 16, "invalid token");
        let (kind, body) = next(&mut out).unwrap().unwrap();
        assert_eq!(kind, Kind::Close);
        assert_eq!(close_of(&body), (16, "invalid token".to_string()));
        let long = "é".repeat(MAX_FRAME);
        put_close(&mut out, 3, &long);
        let (_, body) = next(&mut out).unwrap().unwrap();
        let (code, message) = close_of(&body);
        assert_eq!(code, 3);
        assert!(message.len() <= MAX_FRAME - 5 && message.chars().all(|c| c == 'é'));
        assert_eq!(close_of(b"ab").0, 2);
    }

    /// The preface is neither HTTP/2's (`PRI `) nor an HTTP/1 method.
    #[test]
    fn the_preface_is_told_apart_by_its_first_byte() {
        assert_ne!(PREFACE[0], b'P');
        for method in ["GET", "HEAD", "OPTIONS", "DELETE", "CONNECT", "TRACE"] {
            assert_ne!(PREFACE[0], method.as_bytes()[0]);
        }
    }
}
