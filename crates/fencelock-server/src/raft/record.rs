//! How every value of the database is framed: a checksum over the payload, so
//! that corruption that still parses is detected instead of served.
//!
//! Where it sits: under the log store and the state machine, which store each
//! log entry, vote, committed id, purge point and snapshot through [`seal`] and
//! read them back through [`open`]. A value is
//!
//! | bytes | what |
//! |---|---|
//! | 1 | [`FRAME_V1`], the frame format |
//! | 4 | CRC-32 (IEEE) of the payload, little-endian |
//! | n | the payload (JSON) |
//!
//! redb checks its own pages; this checks the records inside them, end to end
//! (one byte of a log entry changed from `3600000` to `9600000` still parses,
//! and used to replay into a different state). A record that fails its check
//! is a storage error naming the record: the node stops (fails closed) rather
//! than serve from corrupted state. Values written before framing existed are
//! bare JSON objects (they start with `{`); they are read unchecked until the
//! log is purged past them or the snapshot is rewritten.

use super::log_store::DbError;

/// Tag of the first (and only) frame format.
pub(crate) const FRAME_V1: u8 = 0xF1;
const HEADER: usize = 5;

/// `payload` framed with its checksum.
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(FRAME_V1);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of the stored value `bytes` of `record` (a name for errors), if
/// its checksum matches.
pub(crate) fn open<'a>(record: &dyn Fn() -> String, bytes: &'a [u8]) -> Result<&'a [u8], DbError> {
    let corrupt = |why: String| DbError::Corrupt { record: record(), why };
    match bytes.first() {
        Some(&FRAME_V1) if bytes.len() >= HEADER => {
            let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
            let payload = &bytes[HEADER..];
            let actual = crc32fast::hash(payload);
            match stored == actual {
                true => Ok(payload),
                false => Err(corrupt(format!("checksum mismatch (stored {stored:08x}, computed {actual:08x})"))),
            }
        }
        Some(b'{') => Ok(bytes),
        Some(b) => Err(corrupt(format!("unknown record format {b:#04x} in {} bytes", bytes.len()))),
        None => Err(corrupt("empty record".into())),
    }
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
    }
}
