//! The on-disk log of [`super::FileFence`]: its format, its replay, and an
//! appender that makes each record durable before it returns, grouping
//! concurrent appends into one `fdatasync`.
//!
//! # Format
//!
//! ```text
//! file    = magic record*
//! magic   = "FLFENCE1"                      (8 bytes)
//! record  = len:u32le crc:u32le payload     (len = payload length)
//! payload = word:u64le key:utf8             (key 1..=1024 bytes, no NUL)
//! word    = token | READ_BIT if a read       (READ_BIT = 1 << 63)
//! crc     = CRC-32 (IEEE) of payload
//! ```
//!
//! One record per change of a key's marks ([`Marks`]): a write record (top
//! bit clear) sets both marks, a read record (top bit set) raises only
//! `seen`. Replay takes, per key, the largest write token as `write` and the
//! largest token of any record as `seen`. Tokens are at most 2^63-1, so the
//! top bit is free, and a log written before fenced reads (every record a
//! write) replays as `write = seen = its largest token`.
//!
//! # Replay and torn tails
//!
//! A crash can leave the last record torn (cut short, or followed by the
//! zeros of an extent allocated but never written). Such a record was never
//! acknowledged (its `fdatasync` had not returned), so replay drops it and
//! truncates the file there. A bad record that is *followed* by more data is
//! not a torn tail: replay refuses it ([`FenceError::Corrupt`]) rather than
//! guess, because a mark guessed too low would admit a stale token.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::fence::{check_key, Access, FenceError, Marks, MAX_KEY_LEN};

pub(super) const MAGIC: &[u8; 8] = b"FLFENCE1";
const HEADER: usize = 8;
const MIN_PAYLOAD: usize = 8 + 1;
const MAX_PAYLOAD: usize = 8 + MAX_KEY_LEN;

/// Set in a record's token word when it is a read's.
const READ_BIT: u64 = 1 << 63;

/// Encode one record.
pub(super) fn encode(key: &str, token: u64, access: Access) -> Vec<u8> {
    let word = match access {
        Access::Read => token | READ_BIT,
        Access::Write => token,
    };
    let mut payload = Vec::with_capacity(8 + key.len());
    payload.extend_from_slice(&word.to_le_bytes());
    payload.extend_from_slice(key.as_bytes());
    let mut record = Vec::with_capacity(HEADER + payload.len());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32(&payload).to_le_bytes());
    record.extend_from_slice(&payload);
    record
}

/// What replay found.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// The marks of every key.
    pub marks: HashMap<String, Marks>,
    /// How many records were read.
    pub records: usize,
    /// Where the good records end: the file is truncated here if longer.
    pub good_len: usize,
}

/// Replay a whole log file's bytes.
pub(super) fn replay(bytes: &[u8]) -> Result<Replay, FenceError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(FenceError::Corrupt("fence log does not start with FLFENCE1".into()));
    }
    let mut replay = Replay { good_len: MAGIC.len(), ..Replay::default() };
    let mut pos = MAGIC.len();
    while pos < bytes.len() {
        match parse_record(&bytes[pos..]) {
            Parsed::Record { key, token, access, len } => {
                let marks = replay.marks.entry(key).or_default();
                marks.seen = marks.seen.max(token);
                if access == Access::Write {
                    marks.write = marks.write.max(token);
                }
                replay.records += 1;
                pos += len;
                replay.good_len = pos;
            }
            Parsed::Torn => break,
            Parsed::Bad { len, reason } if is_tail(&bytes[pos..], len) => {
                tracing::warn!(offset = pos, reason, "fence log: dropping torn last record");
                break;
            }
            Parsed::Bad { reason, .. } => {
                return Err(FenceError::Corrupt(format!("fence log record at byte {pos}: {reason}")));
            }
        }
    }
    Ok(replay)
}

enum Parsed {
    Record {
        key: String,
        token: u64,
        access: Access,
        len: usize,
    },
    /// Cut short by the end of the file: a torn last write.
    Torn,
    /// Complete but wrong; `len` is its length if the header was sane.
    Bad {
        len: Option<usize>,
        reason: &'static str,
    },
}

fn parse_record(rest: &[u8]) -> Parsed {
    if rest.len() < HEADER {
        return Parsed::Torn;
    }
    let plen = u32::from_le_bytes(rest[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap());
    if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&plen) {
        return Parsed::Bad { len: None, reason: "record length out of range" };
    }
    if rest.len() < HEADER + plen {
        return Parsed::Torn;
    }
    let payload = &rest[HEADER..HEADER + plen];
    let len = Some(HEADER + plen);
    if crc32(payload) != crc {
        return Parsed::Bad { len, reason: "checksum mismatch" };
    }
    let word = u64::from_le_bytes(payload[..8].try_into().unwrap());
    let access = if word & READ_BIT == 0 { Access::Write } else { Access::Read };
    let token = word & !READ_BIT;
    match std::str::from_utf8(&payload[8..]) {
        Ok(key) if check_key(key).is_ok() => Parsed::Record { key: key.to_owned(), token, access, len: HEADER + plen },
        _ => Parsed::Bad { len, reason: "invalid key" },
    }
}

/// A bad record is a torn tail if nothing but zeros follows its start, or if
/// it is exactly the last record of the file.
fn is_tail(rest: &[u8], len: Option<usize>) -> bool {
    rest.iter().all(|&b| b == 0) || len == Some(rest.len())
}

/// Appends records and makes them durable. Fails closed: after any write or
/// sync error every later call fails with [`FenceError::Poisoned`], since a
/// half-written record may sit at the end of the file and, after a failed
/// `fsync`, the kernel may have dropped dirty pages that a retried `fsync`
/// would then report as clean.
pub(super) struct Appender {
    /// The file and how many records were written to it (not yet synced).
    writer: Mutex<(File, u64)>,
    /// How many records are known durable. Held across `fdatasync`, so that
    /// appenders arriving meanwhile wait, then find their record covered by
    /// the next single sync: group commit.
    synced: Mutex<u64>,
    /// A second handle on the same file, synced without blocking writers.
    sync_handle: File,
    poisoned: AtomicBool,
}

impl Appender {
    /// Append to `file` (opened for appending, already truncated to its
    /// good length).
    pub(super) fn new(file: File) -> io::Result<Self> {
        let sync_handle = file.try_clone()?;
        Ok(Self { writer: Mutex::new((file, 0)), synced: Mutex::new(0), sync_handle, poisoned: AtomicBool::new(false) })
    }

    pub(super) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// Append `record` and return once it is durable.
    pub(super) fn append_durable(&self, record: &[u8]) -> Result<(), FenceError> {
        let seq = self.write(record)?;
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        self.check_poison()?;
        if *synced >= seq {
            return Ok(()); // another appender's sync covered this record
        }
        let target = self.writer.lock().unwrap_or_else(|p| p.into_inner()).1;
        self.sync_handle.sync_data().map_err(|e| self.poison(e))?;
        *synced = target;
        Ok(())
    }

    fn write(&self, record: &[u8]) -> Result<u64, FenceError> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        self.check_poison()?;
        writer.0.write_all(record).map_err(|e| self.poison(e))?;
        writer.1 += 1;
        Ok(writer.1)
    }

    fn check_poison(&self) -> Result<(), FenceError> {
        if self.is_poisoned() {
            return Err(FenceError::Poisoned);
        }
        Ok(())
    }

    fn poison(&self, err: io::Error) -> FenceError {
        self.poisoned.store(true, Ordering::SeqCst);
        tracing::error!(error = %err, "fence log write failed; fence fails closed");
        FenceError::from(err)
    }
}

/// CRC-32 (IEEE 802.3, reflected, as in zlib and gzip).
pub(super) fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (n, slot) in table.iter_mut().enumerate() {
            let mut c = n as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            *slot = c;
        }
        table
    });
    !data.iter().fold(!0u32, |c, &b| table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(records: &[(&str, u64)]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        for (key, token) in records {
            bytes.extend(encode(key, *token, Access::Write));
        }
        bytes
    }

    fn single(token: u64) -> Marks {
        Marks::single(token)
    }

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn replay_takes_the_largest_token_per_key() {
        let r = replay(&log_of(&[("a", 3), ("b", 9), ("a", 7)])).unwrap();
        assert_eq!(r.marks, HashMap::from([("a".into(), single(7)), ("b".into(), single(9))]));
        assert_eq!(r.records, 3);
    }

    /// Read records raise only `seen`; write records both marks (the rule on
    /// [`Marks::admit`], as replay rebuilds it).
    #[test]
    fn replay_keeps_reads_apart_from_writes() {
        let mut bytes = log_of(&[("a", 3)]);
        bytes.extend(encode("a", 9, Access::Read));
        bytes.extend(encode("a", 8, Access::Read));
        bytes.extend(encode("b", 4, Access::Read));
        let r = replay(&bytes).unwrap();
        assert_eq!(r.marks["a"], Marks { write: 3, seen: 9 });
        assert_eq!(r.marks["b"], Marks { write: 0, seen: 4 });
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail() {
        let full = log_of(&[("a", 3), ("key-b", 9)]);
        let first_end = log_of(&[("a", 3)]).len();
        for cut in first_end..full.len() {
            let r = replay(&full[..cut]).unwrap();
            assert_eq!(r.marks, HashMap::from([("a".into(), single(3))]), "cut at {cut}");
            assert_eq!(r.good_len, first_end);
        }
    }

    #[test]
    fn zeros_after_the_last_record_are_a_torn_tail() {
        let mut bytes = log_of(&[("a", 3)]);
        let good = bytes.len();
        bytes.extend([0u8; 100]);
        let r = replay(&bytes).unwrap();
        assert_eq!((r.good_len, r.marks["a"]), (good, single(3)));
    }

    #[test]
    fn a_bad_last_record_is_dropped() {
        let mut bytes = log_of(&[("a", 3), ("a", 5)]);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF; // corrupt the key of the last record
        assert_eq!(replay(&bytes).unwrap().marks["a"], single(3));
    }

    #[test]
    fn a_bad_record_in_the_middle_fails_closed() {
        let mut bytes = log_of(&[("a", 3), ("a", 5), ("a", 8)]);
        bytes[MAGIC.len() + 8] ^= 0xFF; // the token of the first record
        assert!(matches!(replay(&bytes), Err(FenceError::Corrupt(_))));
    }

    #[test]
    fn a_foreign_file_is_refused() {
        assert!(matches!(replay(b"hello world"), Err(FenceError::Corrupt(_))));
    }
}
