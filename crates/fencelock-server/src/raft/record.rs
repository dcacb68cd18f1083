//! How every value of the database is framed: a checksum over the payload, so
//! that corruption that still parses is detected instead of served.
//!
//! Where it sits: under the log store and the state machine, which store each
//! log entry, vote, committed id, purge point and snapshot through [`seal`] (or
//! [`seal_coded`]) and read them back through [`open`] (or [`open_coded`]).
//! A value is, in frame V1 (every value but log entries: JSON)
//!
//! | bytes | what |
//! |---|---|
//! | 1 | [`FRAME_V1`], the frame format |
//! | 4 | CRC-32 (IEEE) of the payload, little-endian |
//! | n | the payload (JSON) |
//!
//! or, in frame V2 (log entries, whose payload has a codec of its own, see
//! [`super::codec`])
//!
//! | bytes | what |
//! |---|---|
//! | 1 | [`FRAME_V2`] |
//! | 1 | the payload's codec |
//! | 4 | CRC-32 (IEEE) of the codec byte and the payload, little-endian |
//! | n | the payload |
//!
//! redb checks its own pages; this checks the records inside them, end to end
//! (one byte of a log entry changed from `3600000` to `9600000` still parses,
//! and used to replay into a different state). A record that fails its check
//! is a storage error naming the record: the node stops (fails closed) rather
//! than serve from corrupted state. Values written before framing existed are
//! bare JSON objects (they start with `{`); they are read unchecked until the
//! log is purged past them or the snapshot is rewritten. V1 and bare values
//! are JSON ([`CODEC_JSON`]).

use super::codec::CODEC_JSON;
use super::db_error::DbError;

/// Tag of the first frame format: a JSON payload.
pub(crate) const FRAME_V1: u8 = 0xF1;
pub(crate) const HEADER: usize = 5;
/// Tag of the second frame format: a payload of the codec named after the tag.
pub(crate) const FRAME_V2: u8 = 0xF2;
const HEADER_V2: usize = 6;

/// `payload` framed with its checksum.
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(FRAME_V1);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// `payload`, encoded with `codec`, framed (V2) with its checksum.
pub(crate) fn seal_coded(codec: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_V2 + payload.len());
    out.extend_from_slice(&[FRAME_V2, codec]);
    out.extend_from_slice(&crc_v2(codec, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The checksum of a V2 frame: over its codec byte and its payload.
fn crc_v2(codec: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[codec]);
    h.update(payload);
    h.finalize()
}

/// The payload of the stored value `bytes` of `record` (a name for errors), if
/// its checksum matches and it is JSON (every value but log entries).
pub(crate) fn open<'a>(record: &dyn Fn() -> String, bytes: &'a [u8]) -> Result<&'a [u8], DbError> {
    match open_coded(record, bytes)? {
        (CODEC_JSON, payload) => Ok(payload),
        (codec, _) => Err(DbError::Corrupt { record: record(), why: format!("codec {codec} where JSON belongs") }),
    }
}

/// The codec and payload of the stored value `bytes` of `record` (a name for
/// errors), if its checksum matches: V2 names its codec, V1 and bare values
/// are JSON.
pub(crate) fn open_coded<'a>(record: &dyn Fn() -> String, bytes: &'a [u8]) -> Result<(u8, &'a [u8]), DbError> {
    let corrupt = |why: String| DbError::Corrupt { record: record(), why };
    let check = |stored: u32, actual: u32| match stored == actual {
        true => Ok(()),
        false => Err(corrupt(format!("checksum mismatch (stored {stored:08x}, computed {actual:08x})"))),
    };
    match bytes.first() {
        Some(&FRAME_V1) if bytes.len() >= HEADER => {
            let payload = &bytes[HEADER..];
            check(u32_le(&bytes[1..HEADER]), crc32fast::hash(payload))?;
            Ok((CODEC_JSON, payload))
        }
        Some(&FRAME_V2) if bytes.len() >= HEADER_V2 => {
            let (codec, payload) = (bytes[1], &bytes[HEADER_V2..]);
            check(u32_le(&bytes[2..HEADER_V2]), crc_v2(codec, payload))?;
            Ok((codec, payload))
        }
        Some(b'{') => Ok((CODEC_JSON, bytes)),
        Some(b) => Err(corrupt(format!("unknown record format {b:#04x} in {} bytes", bytes.len()))),
        None => Err(corrupt("empty record".into())),
    }
}

/// The little-endian u32 of the 4 bytes `b`.
fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> String {
        "test record".into()
    }

    #[test]
    fn a_sealed_record_opens_to_its_payload() {
        let sealed = seal(br#"{"a":1}"#);
        assert_eq!(open(&name, &sealed).unwrap(), br#"{"a":1}"#);
        assert_eq!(open(&name, br#"{"legacy":true}"#).unwrap(), br#"{"legacy":true}"#);
    }

    /// Every single-bit flip anywhere in a sealed record is detected (CRC-32
    /// detects all 1- and 2-bit errors).
    #[test]
    fn every_single_bit_flip_is_detected() {
        let sealed = seal(br#"{"GrantLease":{"req":7,"ttl_ms":3600000}}"#);
        for i in 0..sealed.len() {
            for bit in 0..8 {
                let mut bad = sealed.clone();
                bad[i] ^= 1 << bit;
                let err = open(&name, &bad).expect_err("a flipped record must not open");
                assert!(err.to_string().contains("test record"), "{err}");
            }
        }
    }

    #[test]
    fn empty_and_short_records_are_refused() {
        assert!(open(&name, b"").is_err());
        assert!(open(&name, &[FRAME_V1, 1, 2]).is_err());
        assert!(open(&name, b"garbage").is_err());
        assert!(open_coded(&name, &[FRAME_V2, 2, 0, 0, 0]).is_err());
    }

    /// A V2 frame opens to its codec and payload; V1 and bare values open as
    /// JSON; a V2 value of another codec is refused where JSON is expected.
    #[test]
    fn a_coded_record_opens_to_its_codec_and_payload() {
        let sealed = seal_coded(2, b"\x0a\x03abc");
        assert_eq!(open_coded(&name, &sealed).unwrap(), (2, &b"\x0a\x03abc"[..]));
        assert_eq!(open_coded(&name, &seal(b"{}")).unwrap(), (CODEC_JSON, &b"{}"[..]));
        assert_eq!(open_coded(&name, b"{}").unwrap(), (CODEC_JSON, &b"{}"[..]));
        let err = open(&name, &sealed).expect_err("a codec-2 value is not JSON");
        assert!(err.to_string().contains("codec 2"), "{err}");
    }

    /// Every single-bit flip in a V2 record, its codec byte included, is
    /// detected.
    #[test]
    fn every_single_bit_flip_of_a_coded_record_is_detected() {
        let sealed = seal_coded(2, b"\x0a\x06\x08\x07\x10\x01\x18\x2a\x1a\x00");
        for i in 0..sealed.len() {
            for bit in 0..8 {
                let mut bad = sealed.clone();
                bad[i] ^= 1 << bit;
                let err = open_coded(&name, &bad).expect_err("a flipped record must not open");
                assert!(err.to_string().contains("test record"), "{err}");
            }
        }
    }
}
