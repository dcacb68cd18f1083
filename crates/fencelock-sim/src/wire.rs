//! The simulation's wire protocol: JSON lines over turmoil TCP.
//!
//! Client → server: [`Request`] (an engine [`Command`] tagged with a connection-
//! local id). Server → client: [`ServerMsg`], either the [`Reply`] to a request or
//! a [`Push`] that ends a queued acquire. Client → resource: [`ActReq`], answered
//! by [`ActResp`]. [`Frames`] checks that a frame is complete before it parses it
//! (mini-redis style) and is cancel-safe: a read interrupted by a timeout loses no
//! bytes.

use std::io;

use fencelock_core::{Command, Grant, LeaseId, Reply, RequestId, Token, WaitEnd};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A frame longer than this is a protocol error (the connection is closed).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// One client request to the lock server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the client, unique on its connection; echoed in the reply.
    pub id: u64,
    pub cmd: Command,
    /// For an acquire: the client's attempt number of its request id (1, 2,
    /// …), as the real client sends it; 0 for everything else.
    pub attempt: u32,
}

/// The outcome of a queued acquire, pushed when the engine decides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PushOutcome {
    Granted(Grant),
    /// A multi-acquire's grants, one per lock, in the order asked.
    GrantedAll(Vec<Grant>),
    Ended(WaitEnd),
}

/// A pushed outcome for the queued acquire `(lease, req)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Push {
    pub lease: LeaseId,
    pub req: RequestId,
    pub outcome: PushOutcome,
}

/// Server → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    Reply { id: u64, reply: Reply },
    Push(Push),
}

/// What a holder does at the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Act {
    /// A read of the register (a reader, or a downgraded writer), fenced.
    Read,
    /// A write of the register (a writer), fenced.
    Write,
    /// A use of a semaphore permit: recorded, never refused (a semaphore's
    /// holders are concurrent by design, and no token order fences them).
    Use,
    /// A write of the register of [`crate::config::MULTI_LOCKS`]`[i]`, fenced
    /// by that lock's token.
    WriteOn(u8),
}

impl Act {
    /// The register the act goes to (0 is the main lock's, `i + 1` that of
    /// multi-lock `i`) and how it is fenced; `None` for a permit use.
    pub fn fenced(self) -> Option<(u8, fencelock_fence::Access)> {
        use fencelock_fence::Access;
        match self {
            Act::Read => Some((0, Access::Read)),
            Act::Write => Some((0, Access::Write)),
            Act::WriteOn(i) => Some((i + 1, Access::Write)),
            Act::Use => None,
        }
    }
}

/// An act at the fenced resource, carrying the holder's fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActReq {
    pub client: usize,
    pub token: Token,
    pub act: Act,
    /// The holder was paused between its last deadline check and this act
    /// (test metadata, so that the checker can tell Kleppmann's case apart).
    pub after_pause: bool,
}

/// The resource's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActResp {
    Accepted,
    Rejected { highest: Token },
}

/// Reads newline-terminated JSON frames from `R`, keeping partial input buffered.
pub struct Frames<R> {
    rd: R,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Frames<R> {
    pub fn new(rd: R) -> Self {
        Self { rd, buf: Vec::new() }
    }

    /// The next frame, `Ok(None)` at end of stream, `InvalidData` on a bad frame.
    /// Cancel-safe: only `read_buf` awaits, and bytes read stay in the buffer.
    pub async fn next<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return parse(&frame).map(Some);
            }
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// A complete line from the buffer, if one is there.
    fn take_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        match self.buf.iter().position(|b| *b == b'\n') {
            Some(end) => Ok(Some(self.buf.drain(..=end).collect())),
            None if self.buf.len() > MAX_FRAME_BYTES => Err(invalid("frame too long")),
            None => Ok(None),
        }
    }
}

fn parse<T: DeserializeOwned>(frame: &[u8]) -> io::Result<T> {
    serde_json::from_slice(frame).map_err(|e| invalid(&e.to_string()))
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// Write `msg` as one frame.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(msg).map_err(|e| invalid(&e.to_string()))?;
    bytes.push(b'\n');
    w.write_all(&bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8]) -> Frames<&[u8]> {
        Frames::new(input)
    }

    #[tokio::test]
    async fn parses_complete_frames_then_eof() {
        let mut f = frames(b"{\"Nope\":1}\n\"Accepted\"\n");
        assert!(f.next::<ActResp>().await.is_err());
        assert_eq!(f.next::<ActResp>().await.unwrap(), Some(ActResp::Accepted));
        assert_eq!(f.next::<ActResp>().await.unwrap(), None);
    }

    #[tokio::test]
    async fn garbage_is_an_error_not_a_panic() {
        let mut f = frames(b"\xff\xfe not json\n");
        let err = f.next::<Request>().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn an_overlong_frame_is_refused() {
        let long = vec![b'x'; MAX_FRAME_BYTES + 10];
        let mut f = Frames::new(long.as_slice());
        let err = f.next::<Request>().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
