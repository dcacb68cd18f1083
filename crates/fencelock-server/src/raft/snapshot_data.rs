//! [`SnapshotData`], openraft's handle on a snapshot's data: the payload of a
//! snapshot file in `snap/`, read and written in place (issue 38 §3: no
//! copy of a snapshot is in memory, whatever its size).
//!
//! Where it sits: the `SnapshotData` of [`super::TypeConfig`], over the files
//! of `super::snapshot_file`. The state machine hands out one of two kinds:
//! - the stored snapshot, opened for reading (`get_current_snapshot`): the
//!   leader's replication sends it in chunks through openraft's `Chunked`,
//!   which seeks and reads it; its checksum is checked as the bytes pass, in
//!   order, and the read that reaches its end fails if they do not match.
//!   A follower installs only a complete snapshot, so a corrupted one is
//!   never installed anywhere; the leader stops with a storage error (fails
//!   closed), as a start would.
//! - a new file to receive into (`begin_receiving_snapshot`):
//!   [`super::snapshot_rx`] writes each chunk into it as it arrives, decodes
//!   it from there to check it, and `install_snapshot` adopts the file by
//!   rename. Dropped before that (refused, replaced by a newer stream, given
//!   up by openraft), it is removed; a crash leaves it to the next start's
//!   `Files::tidy`.
//!
//! Offsets are the payload's: the frame's header before it is skipped, so
//! that peers see the bytes they always did (the payload's JSON) and a
//! received file needs only its header written to become a snapshot file.

use std::fmt;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::record::HEADER;
use super::snapshot_file::{Opened, Sum};
use super::snapshot_payload::Decoded;

/// Where a payload starts in its file.
const BASE: u64 = HEADER as u64;

/// A snapshot's payload in its file (see the module docs).
pub struct SnapshotData {
    file: tokio::fs::File,
    path: PathBuf,
    /// The payload offset the file is at, as far as reads and seeks tell.
    pos: u64,
    /// Whether a seek was started and not yet completed.
    seeking: bool,
    role: Role,
    /// Removes a received file that was not adopted.
    temp: Temp,
}

enum Role {
    /// The stored snapshot, read to be sent.
    Stored(Check),
    /// A snapshot being received; once [`super::snapshot_rx`] checked it,
    /// what it decoded to.
    Incoming(Option<Box<Decoded>>),
}

/// The check of a stored payload's checksum as it is read in order.
struct Check {
    expected: Sum,
    crc: crc32fast::Hasher,
    /// How many bytes from the start have been summed.
    summed: u64,
    /// Whether the sum was found wrong: every later read fails too.
    failed: bool,
}

/// A file to remove when dropped, unless [`Temp::keep`] took it.
pub(crate) struct Temp(Option<PathBuf>);

impl Temp {
    /// The file, no longer removed on drop.
    pub fn keep(mut self) -> Option<PathBuf> {
        self.0.take()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What [`SnapshotData::into_parts`] gives the state machine's install.
pub(crate) struct Parts {
    pub path: PathBuf,
    pub file: std::fs::File,
    /// The stored payload's sum, for the stored snapshot.
    pub expected: Option<Sum>,
    /// What [`super::snapshot_rx`] decoded, if it checked it.
    pub decoded: Option<Decoded>,
    /// Set for a received file (removed unless kept).
    pub temp: Temp,
}

impl SnapshotData {
    /// The stored snapshot in `opened`, to be read from the start of its payload.
    pub(crate) fn stored(opened: Opened) -> Self {
        let check = Check { expected: opened.expected, crc: Default::default(), summed: 0, failed: false };
        let file = tokio::fs::File::from_std(opened.file);
        Self { file, path: opened.path, pos: 0, seeking: false, role: Role::Stored(check), temp: Temp(None) }
    }

    /// A new file at `path` (its header written, positioned after it) to
    /// receive a snapshot into; removed when dropped unless adopted.
    pub(crate) fn incoming(path: PathBuf, file: std::fs::File) -> Self {
        let file = tokio::fs::File::from_std(file);
        Self { file, temp: Temp(Some(path.clone())), path, pos: 0, seeking: false, role: Role::Incoming(None) }
    }

    /// The file the data is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader of the payload, on a handle of its own (for a blocking thread).
    pub(crate) fn reader(&self) -> io::Result<std::fs::File> {
        use std::io::Seek;
        let mut file = std::fs::File::open(&self.path)?;
        file.seek(SeekFrom::Start(BASE))?;
        Ok(file)
    }

    /// Writes `bytes` at payload offset `offset`, and waits until they are
    /// in the file (not in a buffer of the runtime's).
    pub(crate) async fn write_chunk(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.seek(SeekFrom::Start(offset)).await?;
        self.write_all(bytes).await?;
        self.flush().await
    }

    /// Keeps what a received snapshot decoded to, for its install.
    pub(crate) fn set_decoded(&mut self, decoded: Decoded) {
        if let Role::Incoming(slot) = &mut self.role {
            *slot = Some(Box::new(decoded));
        }
    }

    /// The file (its pending writes done) and what is known of it.
    pub(crate) async fn into_parts(self) -> Parts {
        let SnapshotData { file, path, role, temp, .. } = self;
        let file = file.into_std().await;
        let (expected, decoded) = match role {
            Role::Stored(check) => (Some(check.expected), None),
            Role::Incoming(decoded) => (None, decoded.map(|d| *d)),
        };
        Parts { path, file, expected, decoded, temp }
    }
}

impl Check {
    /// Sums `bytes`, read at payload offset `at`; an error once the whole
    /// payload is summed and its sum is not the frame's.
    fn passed(&mut self, path: &Path, at: u64, bytes: &[u8]) -> io::Result<()> {
        let end = at + bytes.len() as u64;
        if at <= self.summed && end > self.summed {
            self.crc.update(&bytes[(self.summed - at) as usize..]);
            self.summed = end;
            let whole = self.summed == self.expected.bytes;
            self.failed |=
                self.summed > self.expected.bytes || (whole && self.crc.clone().finalize() != self.expected.crc);
        }
        if bytes.is_empty() && at < self.expected.bytes {
            self.failed = true;
        }
        match self.failed {
            false => Ok(()),
            true => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot file {} does not match its checksum: not sent", path.display()),
            )),
        }
    }
}

impl fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match &self.role {
            Role::Stored(_) => "stored",
            Role::Incoming(_) => "incoming",
        };
        f.debug_struct("SnapshotData").field("path", &self.path).field("role", &role).finish_non_exhaustive()
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.file).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        let at = this.pos;
        this.pos += read.len() as u64;
        if let Role::Stored(check) = &mut this.role {
            check.passed(&this.path, at, read)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let position = match position {
            SeekFrom::Start(n) => SeekFrom::Start(n.checked_add(BASE).ok_or(io::ErrorKind::InvalidInput)?),
            relative => relative,
        };
        let this = self.get_mut();
        Pin::new(&mut this.file).start_seek(position)?;
        this.seeking = true;
        Ok(())
    }

    /// The payload offset, once what the file does is done. Without a seek
    /// started, the one this handle knows: tokio's file counts from where
    /// it was handed over, which is after the header.
    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        let at = ready!(Pin::new(&mut this.file).poll_complete(cx))?;
        if !std::mem::take(&mut this.seeking) {
            return Poll::Ready(Ok(this.pos));
        }
        let pos = at.checked_sub(BASE).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "a seek before the start of a snapshot's payload")
        })?;
        this.pos = pos;
        Poll::Ready(Ok(pos))
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Role::Stored(_) = this.role {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::PermissionDenied, "a stored snapshot is read-only")));
        }
        let n = ready!(Pin::new(&mut this.file).poll_write(cx, buf))?;
        this.pos += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_shutdown(cx)
    }
}
