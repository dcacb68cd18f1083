//! What a snapshot's data is: the JSON of [`SnapshotPayload`] (the last
//! applied log id, the last membership, the engine), written and read as a
//! stream and summed as it passes, so that no copy of its bytes is in memory
//! (issue 38 §3). These are the bytes peers send each other (in chunks) and
//! the payload of a snapshot file's frame.
//!
//! Where it sits: under the state machine (which writes a snapshot's data
//! into its file, reads it back at a start and installs received ones), the
//! snapshot receiver ([`super::snapshot_rx`], which decodes a received
//! snapshot from its file before openraft sees it) and the data check
//! ([`super::check`]). It knows neither the database nor where the bytes are.

use std::io::{self, BufReader, Read, Write};

use fencelock_core::Engine;
use openraft::{LogId, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use super::db_error::DbError;
use super::snapshot_file::{Sum, Summing};
use super::{Member, NodeId};

pub(crate) type Membership = StoredMembership<NodeId, Member>;
pub(crate) type Meta = SnapshotMeta<NodeId, Member>;

/// How much of a snapshot is read from its file at a time.
const READ_BUFFER: usize = 1 << 20;

/// The content of a snapshot, borrowed, for encoding.
#[derive(Serialize)]
struct SnapshotPayloadRef<'a> {
    last_applied: &'a Option<LogId<NodeId>>,
    last_membership: &'a Membership,
    engine: &'a Engine,
}

/// The content of a snapshot, decoded.
#[derive(Deserialize)]
pub(crate) struct SnapshotPayload {
    pub last_applied: Option<LogId<NodeId>>,
    pub last_membership: Membership,
    pub engine: Engine,
}

/// A snapshot's payload decoded from a stream, with the sum of the bytes
/// it was decoded from.
pub(crate) struct Decoded {
    pub payload: SnapshotPayload,
    pub sum: Sum,
}

/// Writes the snapshot data of `engine` at `meta`'s point of the log to
/// `out`. Hundreds of MB at a million leases: call it on a blocking thread,
/// never on the runtime's.
pub(crate) fn write(meta: &Meta, engine: &Engine, out: &mut dyn Write) -> Result<(), DbError> {
    let payload =
        SnapshotPayloadRef { last_applied: &meta.last_log_id, last_membership: &meta.last_membership, engine };
    serde_json::to_writer(out, &payload).map_err(DbError::from)
}

/// Decodes a snapshot's payload from `data`, which is read to its end, and
/// the sum of every byte read (also when it does not decode: a caller that
/// knows the sum to expect tells corruption from a bad encoding). Seconds at
/// a million leases: call it on a blocking thread.
pub(crate) fn decode(data: impl Read) -> (Result<SnapshotPayload, DbError>, Sum) {
    let mut reader = BufReader::with_capacity(READ_BUFFER, Summing::new(data));
    let decoded = serde_json::from_reader(&mut reader).map_err(DbError::from);
    // To the end, whatever the decoder left (nothing but whitespace when it
    // decoded), so that the sum covers every byte.
    let drained = io::copy(&mut reader, &mut io::sink());
    let sum = reader.get_ref().sum();
    match (decoded, drained) {
        (Ok(_), Err(e)) => (Err(DbError::Other(format!("cannot read snapshot data: {e}"))), sum),
        (decoded, _) => (decoded, sum),
    }
}

/// The payload of a received snapshot, if its data (read from `data` to its
/// end) decodes and matches its meta (see [`super::snapshot_rx`], which
/// checks a snapshot before it is installed).
pub(crate) fn decode_received(meta: &Meta, data: impl Read) -> Result<Decoded, DbError> {
    let (payload, sum) = decode(data);
    let payload = payload?;
    check(meta, &payload)?;
    Ok(Decoded { payload, sum })
}

/// A snapshot's data must describe the same point of the log as its meta.
pub(crate) fn check(meta: &Meta, payload: &SnapshotPayload) -> Result<(), DbError> {
    if meta.last_log_id != payload.last_applied || meta.last_membership != payload.last_membership {
        return Err(DbError::Other(format!(
            "snapshot data (last applied {:?}) does not match its meta ({meta})",
            payload.last_applied
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta { last_log_id: None, last_membership: Membership::default(), snapshot_id: "s".into() }
    }

    fn sum_of(bytes: &[u8]) -> Sum {
        Sum { crc: crc32fast::hash(bytes), bytes: bytes.len() as u64 }
    }

    /// What is written decodes back, and the sum is of every byte read.
    #[test]
    fn written_data_decodes_with_the_sum_of_its_bytes() {
        let mut bytes = Vec::new();
        write(&meta(), &Engine::new(), &mut bytes).unwrap();
        let decoded = decode_received(&meta(), &bytes[..]).unwrap();
        assert_eq!(decoded.payload.engine, Engine::new());
        assert_eq!(decoded.sum, sum_of(&bytes));
    }

    /// Data that does not decode is still read to its end: its sum is of
    /// every byte, so that a reader of a file can tell it is corrupt.
    #[test]
    fn data_that_does_not_decode_is_summed_to_its_end() {
        let bytes = br#"{"last_applied": nul, "and": "more bytes after the error"}"#;
        let (decoded, sum) = decode(&bytes[..]);
        assert!(decoded.is_err());
        assert_eq!(sum, sum_of(bytes));
    }

    /// A payload of another point of the log than its meta is refused.
    #[test]
    fn data_of_another_point_than_its_meta_is_refused() {
        let mut bytes = Vec::new();
        write(&meta(), &Engine::new(), &mut bytes).unwrap();
        let mut other = meta();
        other.last_log_id = Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), 9));
        assert!(decode_received(&other, &bytes[..]).is_err());
    }
}
