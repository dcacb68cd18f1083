//! The audit log: one JSON line per fenced operation, accepted or stale,
//! appended and fsynced before the client gets its answer. Checkers read it
//! at `GET /log` to verify that accepted tokens never go down per key.
//!
//! A crash can leave the last line torn (no final newline); opening drops it.
//! That line's operation was never answered, so no acknowledged entry is lost.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the fence decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Admitted and carried out.
    Accepted,
    /// Rejected: the token was below the key's mark; nothing changed.
    Stale,
    /// Carried out although the token was below the key's mark, because the
    /// server runs with fencing off (`--unfenced`, for demonstrations only).
    Unfenced,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Position in the log, from 0, without gaps.
    pub seq: u64,
    /// Wall-clock time of the decision, milliseconds since the Unix epoch
    /// (for people; order is `seq`).
    pub time_ms: u64,
    /// `PUT`, `DELETE`, or `GET` for a fenced read.
    pub op: String,
    /// The object key (also the fence key).
    pub key: String,
    /// The `Fencing-Lock` header.
    pub lock: String,
    /// The `Fencing-Token` header.
    pub token: u64,
    /// Accepted or stale.
    pub outcome: Outcome,
    /// The key's mark after the decision (the token itself when accepted).
    pub highest: u64,
}

/// The fields of an entry that the caller supplies.
pub(crate) struct Record {
    pub op: &'static str,
    pub key: String,
    pub lock: String,
    pub token: u64,
    pub outcome: Outcome,
    pub highest: u64,
}

/// Append-only, fsynced per entry. Calls block.
pub(crate) struct AuditLog {
    path: PathBuf,
    /// The file and the next sequence number.
    file: Mutex<(File, u64)>,
}

impl AuditLog {
    /// Open `path`, dropping a torn last line.
    pub(crate) fn open(path: PathBuf) -> io::Result<Self> {
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let good = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        if good < bytes.len() {
            tracing::warn!(path = %path.display(), dropped = bytes.len() - good, "audit log: dropping torn last line");
            file.set_len(good as u64)?;
        }
        file.sync_all()?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let lines = bytes[..good].iter().filter(|&&b| b == b'\n').count() as u64;
        Ok(Self {
            path,
            file: Mutex::new((file, lines)),
        })
    }

    /// Append one entry and fsync it.
    pub(crate) fn append(&self, record: Record) -> io::Result<AuditEntry> {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let entry = AuditEntry {
            seq: file.1,
            time_ms: now_ms(),
            op: record.op.to_owned(),
            key: record.key,
            lock: record.lock,
            token: record.token,
            outcome: record.outcome,
            highest: record.highest,
        };
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        line.push(b'\n');
        file.0.write_all(&line)?;
        file.0.sync_data()?;
        file.1 += 1;
        Ok(entry)
    }

    /// The whole log (complete lines only: appends wait meanwhile).
    pub(crate) fn read_all(&self) -> io::Result<Vec<u8>> {
        let _file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        fs::read(&self.path)
    }
}

/// The one wall-clock read of the storage server: audit timestamps, for
/// people reading the log. Nothing is decided by it (order is `seq`), so it
/// is exempt from the workspace's ban on reading the clock.
#[allow(clippy::disallowed_methods)]
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: u64) -> Record {
        Record {
            op: "PUT",
            key: "k".into(),
            lock: "l".into(),
            token,
            outcome: Outcome::Accepted,
            highest: token,
        }
    }

    #[test]
    fn torn_line_dropped_and_seq_continues() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        {
            let log = AuditLog::open(path.clone()).unwrap();
            assert_eq!(log.append(record(1)).unwrap().seq, 0);
            assert_eq!(log.append(record(2)).unwrap().seq, 1);
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"seq":2,"time_ms":1"#).unwrap();
        let log = AuditLog::open(path.clone()).unwrap();
        assert_eq!(log.append(record(3)).unwrap().seq, 2);
        let text = String::from_utf8(log.read_all().unwrap()).unwrap();
        let tokens: Vec<u64> = text
            .lines()
            .map(|l| serde_json::from_str::<AuditEntry>(l).unwrap().token)
            .collect();
        assert_eq!(tokens, vec![1, 2, 3]);
    }
}
