//! `GET /log` as a stream: the kept audit files of a snapshot, read line by
//! line and sent in chunks, so a reader costs a fixed amount of memory (a
//! read buffer and one chunk) however long the log and however slow the
//! reader.

use std::collections::VecDeque;
use std::io;

use axum::body::{Body, Bytes};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Take};

use super::audit::{SeqOnly, SnapshotFile};

/// Send about this many bytes per chunk.
const CHUNK: usize = 32 * 1024;
/// The longest line read; a longer one is an error (entries are < 1 KiB).
const MAX_LINE: u64 = 64 * 1024;

/// The entries of `files` (oldest first) with `seq >= from`, at most `limit`.
pub(crate) fn log_body(files: Vec<SnapshotFile>, from: u64, limit: u64) -> Body {
    let mut files = VecDeque::from(files);
    // Skip whole files that end before `from`.
    while files.len() > 1 && files[1].first_seq.is_some_and(|s| s <= from) {
        files.pop_front();
    }
    let reader = LogReader { files, current: None, from, left: limit, line: Vec::new() };
    Body::from_stream(futures::stream::try_unfold(reader, |mut r| async move {
        Ok::<_, io::Error>(r.next_chunk().await?.map(|chunk| (Bytes::from(chunk), r)))
    }))
}

struct LogReader {
    files: VecDeque<SnapshotFile>,
    current: Option<Take<BufReader<tokio::fs::File>>>,
    from: u64,
    left: u64,
    line: Vec<u8>,
}

impl LogReader {
    /// The next chunk of whole lines, or `None` at the end.
    async fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut chunk = Vec::new();
        while chunk.len() < CHUNK && self.left > 0 {
            let reader = match &mut self.current {
                Some(reader) => reader,
                None => {
                    let Some(next) = self.files.pop_front() else {
                        break;
                    };
                    let file = tokio::fs::File::from_std(next.file);
                    self.current = Some(BufReader::new(file).take(next.len));
                    continue;
                }
            };
            self.line.clear();
            let n = reader.take(MAX_LINE).read_until(b'\n', &mut self.line).await?;
            if n == 0 {
                self.current = None;
                continue;
            }
            if self.line.last() != Some(&b'\n') {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "audit log line too long or cut short"));
            }
            let seq = serde_json::from_slice::<SeqOnly>(&self.line).map(|s| s.seq);
            if seq.is_ok_and(|seq| seq < self.from) {
                continue;
            }
            chunk.extend_from_slice(&self.line);
            self.left -= 1;
        }
        Ok((!chunk.is_empty()).then_some(chunk))
    }
}
