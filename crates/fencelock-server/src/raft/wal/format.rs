//! The bytes of a segment: its header and its records.
//!
//! Where it sits: [`super::segments`] writes what [`push_record`] encodes and reads
//! segments back through [`parse_header`] and [`parse_record`]. All integers
//! are little-endian; every record starts at a multiple of 8 bytes, so a scan
//! can look for records after a bad one at those offsets only.
//!
//! Segment header, [`HEADER_LEN`] bytes:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | [`MAGIC`] |
//! | 4 | format version, [`FORMAT_VERSION`] |
//! | 4 | zero (reserved) |
//! | 8 | index of the segment's first record (also its file name) |
//! | 4 | CRC-32 of the 24 bytes before |
//! | 4 | zero (reserved) |
//!
//! Record, [`RECORD_HEADER_LEN`] bytes, then the payload, then zeros up to the
//! next multiple of 8:
//!
//! | bytes | what |
//! |---|---|
//! | 4 | payload length (> 0) |
//! | 4 | CRC-32 of the length, the 24 bytes after the CRC, and the payload |
//! | 8 | log index |
//! | 8 | term |
//! | 1 | codec: [`CODEC_JSON`] |
//! | 3 | zero (reserved) |
//! | 4 | position in its batch: log index minus the index of the batch's first record |
//!
//! A region of zeros (the preallocated rest of a segment) ends the records.
//!
//! The batch of a record (the index of the first record written with it, by
//! one group commit: [`Record::batch`]) lets the start-up scan tell a torn
//! batch from corruption: a power loss during a batch's `fdatasync` can
//! persist any subset of that batch's pages, so a hole followed by records of
//! that same batch is a torn write, a hole followed by a later batch is not
//! (see `segments.rs`). The position field was a reserved zero before format
//! version 1 was released; the version stays 1.

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"FLWALSEG";
/// The one format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of a segment header.
pub const HEADER_LEN: usize = 32;
/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 32;
/// Codec of a payload: the JSON of `openraft::Entry<TypeConfig>`. A binary
/// codec gets the next number, without a new format version.
pub const CODEC_JSON: u8 = 1;
/// The largest payload a record holds.
pub const MAX_PAYLOAD: usize = u32::MAX as usize;

/// A segment header that did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadHeader {
    /// All zeros, or shorter than a header: a segment whose creation did not
    /// finish.
    Unwritten,
    /// A version this build does not read.
    Version(u32),
    /// Anything else: a wrong magic, checksum or reserved bytes.
    Corrupt(String),
}

/// The header of a new segment whose first record is `first_index`.
pub fn header(first_index: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&first_index.to_le_bytes());
    let crc = crc32fast::hash(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether `bytes` are all zeros: the state of a segment after its records.
/// Compared a block at a time with `==` (one `memcmp` each, fast in a debug
/// build too: a byte-by-byte loop over a 64 MiB segment made every start of a
/// debug build spend a quarter of a second here).
pub fn all_zeros(bytes: &[u8]) -> bool {
    const BLOCK: usize = 4096;
    static ZEROS: [u8; BLOCK] = [0; BLOCK];
    bytes.chunks(BLOCK).all(|c| c == &ZEROS[..c.len()])
}

/// The first index named by the header at the start of `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<u64, BadHeader> {
    if bytes.len() < HEADER_LEN {
        return match all_zeros(bytes) {
            true => Err(BadHeader::Unwritten),
            false => Err(BadHeader::Corrupt(format!("a header of {} bytes", bytes.len()))),
        };
    }
    let h = &bytes[..HEADER_LEN];
    if all_zeros(h) {
        return Err(BadHeader::Unwritten);
    }
    if h[..8] != MAGIC {
        return Err(BadHeader::Corrupt("not a segment (wrong magic)".into()));
    }
    let version = u32_at(h, 8);
    if version != FORMAT_VERSION {
        return Err(BadHeader::Version(version));
    }
    let (stored, actual) = (u32_at(h, 24), crc32fast::hash(&h[..24]));
    if stored != actual {
        return Err(BadHeader::Corrupt(format!(
            "header checksum mismatch (stored {stored:08x}, computed {actual:08x})"
        )));
    }
    Ok(u64_at(h, 16))
}

/// What a record holds (the payload still encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub index: u64,
    pub term: u64,
    pub codec: u8,
    /// Index of the first record of the batch this one was written with.
    pub batch: u64,
    pub payload: &'a [u8],
}

/// Bytes a record of `payload_len` takes, padding included.
pub fn record_len(payload_len: usize) -> usize {
    (RECORD_HEADER_LEN + payload_len).next_multiple_of(8)
}

/// Where a record goes: its entry's log index and term, and the index of the
/// first record of its batch (at most `index`, at most [`MAX_BATCH`] before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordId {
    pub index: u64,
    pub term: u64,
    pub batch: u64,
}

/// The most records a batch holds (its position field is 4 bytes).
pub const MAX_BATCH: u64 = u32::MAX as u64 + 1;

/// Appends the record `id` with `payload` (of `codec`) to `out`.
pub fn push_record(out: &mut Vec<u8>, id: RecordId, codec: u8, payload: &[u8]) {
    debug_assert!(!payload.is_empty() && payload.len() <= MAX_PAYLOAD);
    debug_assert!(id.batch <= id.index && id.index - id.batch < MAX_BATCH);
    let start = out.len();
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&id.index.to_le_bytes());
    h[16..24].copy_from_slice(&id.term.to_le_bytes());
    h[24] = codec;
    h[28..32].copy_from_slice(&((id.index - id.batch) as u32).to_le_bytes());
    let crc = record_crc(&h, payload);
    h[4..8].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    out.resize(start + record_len(payload.len()), 0);
}

/// The record at the start of `bytes`.
pub enum Parsed<'a> {
    /// A record, and the bytes it takes.
    Record(Record<'a>, usize),
    /// Zeros (or nothing): no record here.
    Zeros,
    /// Something that is not a whole record: why.
    Bad(String),
}

/// Parses the record at the start of `bytes`.
pub fn parse_record(bytes: &[u8]) -> Parsed<'_> {
    if bytes.len() < RECORD_HEADER_LEN {
        return match all_zeros(bytes) {
            true => Parsed::Zeros,
            false => Parsed::Bad(format!("a record header cut short at {} bytes", bytes.len())),
        };
    }
    let h = &bytes[..RECORD_HEADER_LEN];
    if all_zeros(h) {
        return Parsed::Zeros;
    }
    let len = u32_at(h, 0) as usize;
    if len == 0 {
        return Parsed::Bad("a record of length 0".into());
    }
    if RECORD_HEADER_LEN + len > bytes.len() {
        return Parsed::Bad(format!("a record of {len} bytes with {} bytes left", bytes.len() - RECORD_HEADER_LEN));
    }
    let payload = &bytes[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len];
    let (stored, actual) = (u32_at(h, 4), record_crc(h, payload));
    if stored != actual {
        return Parsed::Bad(format!("record checksum mismatch (stored {stored:08x}, computed {actual:08x})"));
    }
    if h[25..28].iter().any(|b| *b != 0) {
        return Parsed::Bad("nonzero reserved bytes in a record header".into());
    }
    let index = u64_at(h, 8);
    let Some(batch) = index.checked_sub(u64::from(u32_at(h, 28))) else {
        return Parsed::Bad(format!("record of index {index} placed {} records into its batch", u32_at(h, 28)));
    };
    let record = Record { index, term: u64_at(h, 16), codec: h[24], batch, payload };
    Parsed::Record(record, record_len(len).min(bytes.len()))
}

/// The first 8-aligned offset at or after `from` in `bytes` where a whole
/// record with a valid checksum starts, if any.
pub fn find_record(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from.next_multiple_of(8);
    while at + RECORD_HEADER_LEN <= bytes.len() {
        // Most offsets (zeros, the middle of a payload) fail on the length.
        let len = u32_at(bytes, at) as usize;
        if len > 0
            && at + RECORD_HEADER_LEN + len <= bytes.len()
            && matches!(parse_record(&bytes[at..]), Parsed::Record(..))
        {
            return Some(at);
        }
        at += 8;
    }
    None
}

fn record_crc(h: &[u8], payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[..4]);
    crc.update(&h[8..RECORD_HEADER_LEN]);
    crc.update(payload);
    crc.finalize()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(index: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        push_record(&mut out, RecordId { index, term: 3, batch: index.saturating_sub(2) }, CODEC_JSON, payload);
        out
    }

    /// What follows the records is judged by `all_zeros`: any one byte that
    /// is not zero, wherever it is (first, last, across a block's edge, in a
    /// short last block), makes it false.
    #[test]
    fn all_zeros_sees_any_byte_that_is_not() {
        assert!(all_zeros(&[]));
        let zeros = vec![0u8; 3 * 4096 + 17];
        assert!(all_zeros(&zeros));
        for at in [0, 4095, 4096, 8191, 3 * 4096, zeros.len() - 1] {
            let mut b = zeros.clone();
            b[at] = 1;
            assert!(!all_zeros(&b), "a non-zero byte at {at}");
        }
    }

    /// A record reads back as written, padded to 8 bytes.
    #[test]
    fn a_record_round_trips() {
        let bytes = one(42, b"{\"x\":1}");
        assert_eq!(bytes.len() % 8, 0);
        match parse_record(&bytes) {
            Parsed::Record(r, len) => {
                let want = Record { index: 42, term: 3, codec: CODEC_JSON, batch: 40, payload: b"{\"x\":1}" };
                assert_eq!(r, want);
                assert_eq!(len, bytes.len());
            }
            _ => panic!("the record must parse"),
        }
    }

    /// Every single-bit flip in a record (header, payload, not the padding)
    /// makes it unreadable: the checksum covers the header fields too.
    #[test]
    fn every_bit_flip_of_a_record_is_detected() {
        let payload = b"{\"GrantLease\":{\"req\":7,\"ttl_ms\":3600000}}";
        let bytes = one(7, payload);
        for i in 0..RECORD_HEADER_LEN + payload.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(!matches!(parse_record(&bad), Parsed::Record(..)), "flip at byte {i} bit {bit} went unseen");
            }
        }
    }

    /// Zeros are the end of the records; a record cut anywhere is bad.
    #[test]
    fn zeros_end_the_records_and_a_cut_record_is_bad() {
        assert!(matches!(parse_record(&[0u8; 64]), Parsed::Zeros));
        assert!(matches!(parse_record(&[]), Parsed::Zeros));
        let bytes = one(1, b"{\"payload\":\"some bytes\"}");
        for cut in 1..RECORD_HEADER_LEN + 24 {
            assert!(matches!(parse_record(&bytes[..cut]), Parsed::Bad(_)), "cut at {cut}");
        }
    }

    /// A header reads back; a zeroed one is unwritten; an unknown version is
    /// named as such; a flipped byte is corrupt.
    #[test]
    fn headers_parse_and_unknown_versions_are_named() {
        assert_eq!(parse_header(&header(12345)), Ok(12345));
        assert_eq!(parse_header(&[0u8; HEADER_LEN]), Err(BadHeader::Unwritten));
        assert_eq!(parse_header(&[0u8; 5]), Err(BadHeader::Unwritten));
        let mut v2 = header(1);
        v2[8] = 2;
        assert_eq!(parse_header(&v2), Err(BadHeader::Version(2)));
        let mut flipped = header(1);
        flipped[17] ^= 1;
        assert!(matches!(parse_header(&flipped), Err(BadHeader::Corrupt(_))));
    }

    /// A valid record is found after garbage, at its aligned offset.
    #[test]
    fn find_record_skips_garbage() {
        let mut bytes = vec![0xAB; 24];
        bytes.extend(one(9, b"{}"));
        assert_eq!(find_record(&bytes, 0), Some(24));
        assert_eq!(find_record(&bytes, 25), None);
    }
}
