//! The audit log: one JSON line per fenced operation, accepted or stale.
//! Checkers read it at `GET /log` to verify that accepted tokens never go
//! down per key.
//!
//! # Durability
//!
//! An accepted operation's entry is written and fsynced before the client
//! gets its answer ([`Durability::Sync`]), as is every entry written before
//! it. A rejected (stale) request changed nothing, so its entry is buffered
//! ([`Durability::Buffered`]): it is written out when the buffer fills, and
//! fsynced by the next accepted entry or by [`AuditLog::flush`], which the
//! server calls every [`AUDIT_FLUSH_INTERVAL`]. A flood of stale requests
//! therefore costs no fsync each; a crash can lose the entries of the last
//! rejections (at most about one interval's worth), never an accepted one,
//! and never leaves a gap in `seq` (what is lost is always a suffix).
//!
//! A crash can leave the last line torn (no final newline); opening drops it.
//! That line's operation was never answered, so no acknowledged entry is lost.
//!
//! # Rotation
//!
//! When an entry would take `audit.log` past [`AuditConfig::max_file_bytes`],
//! the file is fsynced and renamed `audit.log.1` (an older `.1` becomes `.2`,
//! and so on); the oldest beyond [`AuditConfig::keep_files`] is removed. The
//! log on disk is thus at most `(keep_files + 1) × max_file_bytes` plus one
//! line. `seq` runs on across files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the fence decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Admitted and carried out (for op `RESET`: the operator's reset).
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
    /// `PUT`, `DELETE`, `GET` for a fenced read, or `RESET` for an operator's
    /// reset of the key's mark (`fencelock storage reset-mark`).
    pub op: String,
    /// The object key (also the fence key).
    pub key: String,
    /// The `Fencing-Lock` header (empty for `RESET`).
    pub lock: String,
    /// The `Fencing-Token` header (for `RESET`: the mark before, 0 for none).
    pub token: u64,
    /// Accepted or stale.
    pub outcome: Outcome,
    /// The key's mark after the decision (the token itself when accepted;
    /// for `RESET` the new mark, 0 for none: a checker replaying the log
    /// starts the key afresh there).
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

/// Whether an append returns only once its entry is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Written and fsynced (with everything before it) before returning.
    Sync,
    /// Buffered; made durable by the next `Sync` append or [`AuditLog::flush`].
    Buffered,
}

/// The default size at which `audit.log` is rotated: 64 MiB.
pub const DEFAULT_AUDIT_MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// The default number of rotated files kept (`audit.log.1` … `.4`).
pub const DEFAULT_AUDIT_KEEP_FILES: usize = 4;
/// How often buffered entries (of rejected requests) are made durable.
pub const AUDIT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// The audit log's rotation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditConfig {
    /// Rotate `audit.log` before an entry would take it past this many bytes.
    pub max_file_bytes: u64,
    /// How many rotated files to keep; older ones are removed.
    pub keep_files: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self { max_file_bytes: DEFAULT_AUDIT_MAX_FILE_BYTES, keep_files: DEFAULT_AUDIT_KEEP_FILES }
    }
}

/// The longest line read back: entries are well under 1 KiB (keys ≤ 200
/// bytes, lock names ≤ 256).
const MAX_LINE: usize = 64 * 1024;

/// The open file and what is known about it.
struct Writer {
    file: BufWriter<File>,
    /// Bytes in the current file, buffered ones included.
    len: u64,
    next_seq: u64,
    /// Bytes were written since the last fsync.
    dirty: bool,
}

/// Append-only with rotation. Calls block.
pub(crate) struct AuditLog {
    path: PathBuf,
    config: AuditConfig,
    writer: Mutex<Writer>,
}

/// One file of a [`AuditLog::snapshot`]: read `len` bytes of it.
pub(crate) struct SnapshotFile {
    pub file: File,
    pub len: u64,
    /// The `seq` of its first entry, if it has one.
    pub first_seq: Option<u64>,
}

impl AuditLog {
    /// Open `path`, dropping a torn last line.
    pub(crate) fn open(path: PathBuf, config: AuditConfig) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).read(true).append(true).open(&path)?;
        let (good, last) = last_line(&file, &path)?;
        let len = file.metadata()?.len();
        if good < len {
            tracing::warn!(path = %path.display(), dropped = len - good, "audit log: dropping torn last line");
            file.set_len(good)?;
        }
        file.sync_all()?;
        sync_parent(&path)?;
        let last = match last {
            Some(line) => Some(line),
            None => last_rotated_line(&path)?,
        };
        let next_seq = match last {
            Some(line) => parse_seq(&line, &path)? + 1,
            None => 0,
        };
        Ok(Self {
            path,
            config,
            writer: Mutex::new(Writer {
                file: BufWriter::with_capacity(64 * 1024, file),
                len: good,
                next_seq,
                dirty: false,
            }),
        })
    }

    /// Append one entry, durably or buffered.
    pub(crate) fn append(&self, record: Record, durability: Durability) -> io::Result<AuditEntry> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let entry = AuditEntry {
            seq: w.next_seq,
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
        if w.len > 0 && w.len + line.len() as u64 > self.config.max_file_bytes {
            self.rotate(&mut w)?;
        }
        w.file.write_all(&line)?;
        w.len += line.len() as u64;
        w.next_seq += 1;
        w.dirty = true;
        if durability == Durability::Sync {
            sync(&mut w)?;
        }
        Ok(entry)
    }

    /// Make every buffered entry durable.
    pub(crate) fn flush(&self) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if w.dirty {
            sync(&mut w)?;
        }
        Ok(())
    }

    /// The kept files, oldest first, each open and with the length that
    /// holds only complete lines as of now: later appends and rotations do
    /// not change what a reader of the snapshot sees.
    pub(crate) fn snapshot(&self) -> io::Result<Vec<SnapshotFile>> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        w.file.flush()?;
        let mut files = Vec::new();
        for n in (1..=self.config.keep_files).rev() {
            match File::open(rotated(&self.path, n)) {
                Ok(file) => {
                    let len = file.metadata()?.len();
                    files.push(snapshot_file(file, len)?);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        files.push(snapshot_file(File::open(&self.path)?, w.len)?);
        Ok(files)
    }

    /// Close the current file as `audit.log.1` (shifting older ones) and
    /// start a new one.
    fn rotate(&self, w: &mut Writer) -> io::Result<()> {
        sync(w)?;
        let keep = self.config.keep_files;
        if keep == 0 {
            fs::remove_file(&self.path)?;
        } else {
            for n in (1..keep).rev() {
                match fs::rename(rotated(&self.path, n), rotated(&self.path, n + 1)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            fs::rename(&self.path, rotated(&self.path, 1))?;
        }
        let file = OpenOptions::new().create(true).read(true).append(true).open(&self.path)?;
        sync_parent(&self.path)?;
        w.file = BufWriter::with_capacity(64 * 1024, file);
        w.len = 0;
        tracing::info!(path = %self.path.display(), keep, "audit log rotated");
        Ok(())
    }
}

fn sync(w: &mut Writer) -> io::Result<()> {
    w.file.flush()?;
    w.file.get_ref().sync_data()?;
    w.dirty = false;
    Ok(())
}

/// `audit.log.N`.
fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn snapshot_file(mut file: File, len: u64) -> io::Result<SnapshotFile> {
    let mut head = vec![0; MAX_LINE.min(len as usize)];
    file.read_exact(&mut head)?;
    file.seek(SeekFrom::Start(0))?;
    let first_seq = head
        .iter()
        .position(|&b| b == b'\n')
        .and_then(|end| serde_json::from_slice::<SeqOnly>(&head[..end]).ok())
        .map(|s| s.seq);
    Ok(SnapshotFile { file, len, first_seq })
}

/// Just the `seq` of a line.
#[derive(Deserialize)]
pub(crate) struct SeqOnly {
    pub seq: u64,
}

/// Where the complete lines of `file` end, and its last complete line.
fn last_line(file: &File, path: &Path) -> io::Result<(u64, Option<Vec<u8>>)> {
    let len = file.metadata()?.len();
    let window = len.min(2 * MAX_LINE as u64);
    let mut tail = vec![0; window as usize];
    let mut reader = file;
    reader.seek(SeekFrom::Start(len - window))?;
    reader.read_exact(&mut tail)?;
    let Some(end) = tail.iter().rposition(|&b| b == b'\n') else {
        if window < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("audit log {}: no line end in its last {window} bytes", path.display()),
            ));
        }
        return Ok((0, None));
    };
    let start = tail[..end].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    Ok((len - window + end as u64 + 1, Some(tail[start..end].to_vec())))
}

/// The last line of `audit.log.1`, for a current file that is empty.
fn last_rotated_line(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let path = rotated(path, 1);
    match File::open(&path) {
        Ok(file) => Ok(last_line(&file, &path)?.1),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn parse_seq(line: &[u8], path: &Path) -> io::Result<u64> {
    serde_json::from_slice::<SeqOnly>(line).map(|s| s.seq).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("audit log {}: last line is not an audit entry ({e}); move the file aside", path.display()),
        )
    })
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

/// The one wall-clock read of the storage server: audit timestamps, for
/// people reading the log. Nothing is decided by it (order is `seq`), so it
/// is exempt from the workspace's ban on reading the clock.
#[allow(clippy::disallowed_methods)]
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: u64) -> Record {
        Record { op: "PUT", key: "k".into(), lock: "l".into(), token, outcome: Outcome::Accepted, highest: token }
    }

    fn tokens_in(path: &Path) -> Vec<u64> {
        fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<AuditEntry>(l).unwrap().token)
            .collect()
    }

    #[test]
    fn torn_line_dropped_and_seq_continues() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        {
            let log = AuditLog::open(path.clone(), AuditConfig::default()).unwrap();
            assert_eq!(log.append(record(1), Durability::Sync).unwrap().seq, 0);
            assert_eq!(log.append(record(2), Durability::Sync).unwrap().seq, 1);
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"seq":2,"time_ms":1"#).unwrap();
        let log = AuditLog::open(path.clone(), AuditConfig::default()).unwrap();
        assert_eq!(log.append(record(3), Durability::Sync).unwrap().seq, 2);
        assert_eq!(tokens_in(&path), vec![1, 2, 3]);
    }

    /// Issue 14 finding: rejected requests were fsynced one by one. A
    /// buffered entry is not in the file until a sync append or a flush.
    #[test]
    fn buffered_entries_wait_for_the_next_sync_or_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(path.clone(), AuditConfig::default()).unwrap();
        log.append(record(1), Durability::Buffered).unwrap();
        log.append(record(2), Durability::Buffered).unwrap();
        assert_eq!(tokens_in(&path), Vec::<u64>::new(), "buffered, not written");
        log.append(record(3), Durability::Sync).unwrap();
        assert_eq!(tokens_in(&path), vec![1, 2, 3], "a sync append carries the buffer");
        log.append(record(4), Durability::Buffered).unwrap();
        log.flush().unwrap();
        assert_eq!(tokens_in(&path), vec![1, 2, 3, 4]);
    }

    /// Issue 14 finding: the audit log grew without bound. It rotates by
    /// size, keeps `keep_files` old files, and `seq` runs on across files
    /// and across a reopen after a rotation.
    #[test]
    fn rotation_bounds_the_files_and_seq_runs_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let one = serde_json::to_vec(&AuditEntry {
            seq: 10,
            time_ms: now_ms(),
            op: "PUT".into(),
            key: "k".into(),
            lock: "l".into(),
            token: 10,
            outcome: Outcome::Accepted,
            highest: 10,
        })
        .unwrap()
        .len() as u64
            + 1;
        let config = AuditConfig { max_file_bytes: 3 * one, keep_files: 2 };
        let log = AuditLog::open(path.clone(), config).unwrap();
        for token in 10..30 {
            log.append(record(token), Durability::Sync).unwrap();
        }
        let mut names: Vec<_> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["audit.log", "audit.log.1", "audit.log.2"]);
        for name in &names {
            assert!(fs::metadata(dir.path().join(name)).unwrap().len() <= 3 * one);
        }
        assert_eq!(tokens_in(&path), vec![28, 29]);
        assert_eq!(tokens_in(&rotated(&path, 1)), vec![25, 26, 27]);
        let seqs: Vec<Option<u64>> = log.snapshot().unwrap().iter().map(|f| f.first_seq).collect();
        assert_eq!(seqs, vec![Some(12), Some(15), Some(18)]);
        assert_eq!(log.append(record(30), Durability::Sync).unwrap().seq, 20);
        drop(log);
        // A crash right after a rotation leaves an empty current file: seq
        // goes on from audit.log.1's last line.
        fs::rename(rotated(&path, 1), rotated(&path, 2)).unwrap();
        fs::rename(&path, rotated(&path, 1)).unwrap();
        fs::write(&path, b"").unwrap();
        let log = AuditLog::open(path.clone(), config).unwrap();
        assert_eq!(log.append(record(31), Durability::Sync).unwrap().seq, 21);
    }
}
