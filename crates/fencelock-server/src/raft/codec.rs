//! How a Raft log entry (`openraft::Entry<TypeConfig>`) is turned into bytes
//! on this node's disk, and back: the entry codecs.
//!
//! Where it sits: under the log store. redb's `raft_log` values carry a codec
//! byte in their frame ([`super::record::FRAME_V2`]), the segment log's records
//! a codec byte in their header (`super::wal::format`); both call
//! [`encode_entry`] and [`decode_entry`]. Every other value (vote, committed
//! and purge ids, identity, snapshots) stays JSON.
//!
//! | id | codec |
//! |---|---|
//! | [`CODEC_JSON`] (1) | serde JSON of the entry: everything written before codec 2, still read |
//! | [`CODEC_PROTO`] (2) | protobuf, `fencelock.log.v1.Entry` (`crates/fencelock-proto/proto/fencelock/v1/log.proto`): what is written now |
//!
//! Why protobuf: entries are the hot path (every command is one, written once
//! and read back at start-up and by lagging followers), and JSON spells every
//! field name of every command. Protobuf evolves the way the JSON entries have
//! (`#[serde(default)]` on each field added later): a field added to
//! `log.proto` is read as its default from older entries, so additions need no
//! new codec. Anything else (a field whose default would mean something else,
//! a changed type) gets a new codec id; old ids stay readable.
//!
//! Decoding checks what the JSON path checks: a missing log id, payload,
//! input or command kind, an unknown enum value, a string that is not UTF-8,
//! malformed protobuf: each is a [`CodecError::Corrupt`] naming the record, never
//! a panic. (The frame's CRC catches flipped bytes before the codec runs.)
//!
//! Peers send each other entries in codec 2 as well (the framed
//! `AppendEntriesV2` and its stream, `network.rs`; the unary JSON call stays
//! for older peers). An input keeps the bytes it was encoded to or decoded
//! from ([`LogInput`]): the leader encodes an entry once, for its own log, and
//! sends those bytes to every follower; a follower writes an input's bytes as
//! they came. A field a newer leader adds to `log.proto` thus reaches an older
//! follower's log intact (that follower skips it when it decodes), and a newer
//! node again from there. A node started on an older binary that lacks
//! codec 2 refuses the data dir: its segment log reports "unknown codec 2 of
//! entry …", its redb log "unknown record format 0xf2" (frame V2). This binary
//! names any codec it does not know, and that a newer version wrote it.
//!
//! Size and speed of a typical entry (a `Batch` of 16 acquires, releases and
//! keep-alives), JSON against codec 2: `tests::codec_size_and_speed`, an
//! ignored test run by hand (`cargo nextest run -p fencelock-server --release
//! --run-ignored only codec_size_and_speed --no-capture`). On 2026-11-26, on
//! a 2-core machine shared with two other builds (load 5–8), three runs:
//!
//! | codec | bytes | encode + decode |
//! |---|---|---|
//! | JSON | 1,807 | 6.5–7.7 µs |
//! | protobuf | 655 (36 %) | 3.5–5.4 µs |
//!
//! The time is small against an fsync either way; the size is what each
//! append writes (and each follower's log, and each record's CRC, covers).

use bytes::Bytes;
use fencelock_core::{Acquire, Caller, ClusterId, Command, Input, LeaseId, Mode, RequestId, Token};
use fencelock_proto::log as pb;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use prost::Message;

use super::{LogInput, NodeId, TypeConfig};

/// Codec 1: the serde JSON of the entry.
pub(crate) const CODEC_JSON: u8 = 1;
/// Codec 2: protobuf `fencelock.log.v1.Entry`.
pub(crate) const CODEC_PROTO: u8 = 2;
/// The codec new entries are written with.
pub(crate) const CODEC_CURRENT: u8 = CODEC_PROTO;

/// Why a log entry could not be encoded or decoded. Its own type, not the
/// storage's [`super::db_error::DbError`] (which converts from it), so that the
/// segment log and the database can both build on the codec without an
/// import circle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The bytes do not decode as an entry: `record` names where they were.
    #[error("corrupt record {record}: {why}")]
    Corrupt { record: String, why: String },
}

/// `entry` in the current codec ([`CODEC_CURRENT`]). An input that carries
/// its bytes ([`LogInput::encoded`]) is not encoded again: they are copied.
pub(crate) fn encode_entry(entry: &Entry<TypeConfig>) -> Result<Vec<u8>, CodecError> {
    let payload = raw_payload(&entry.payload)?;
    Ok(RawEntry { log_id: Some(log_id_to_pb(&entry.log_id)), payload: Some(payload) }.encode_to_vec())
}

/// [`encode_entry`], and an input left without its bytes keeps them, for
/// whoever reads the entry next (the log store calls this as it appends).
pub(crate) fn encode_and_keep(entry: &mut Entry<TypeConfig>) -> Result<Vec<u8>, CodecError> {
    if let EntryPayload::Normal(d) = &mut entry.payload {
        if d.encoded().is_none() {
            d.keep_encoded(encode_input(d.input())?);
        }
    }
    encode_entry(entry)
}

/// The entry `bytes` hold in `codec`; `record` names it for errors. In
/// codec 2 an input keeps the bytes it was decoded from.
pub(crate) fn decode_entry(
    record: &dyn Fn() -> String,
    codec: u8,
    bytes: &[u8],
) -> Result<Entry<TypeConfig>, CodecError> {
    let decoded = match codec {
        CODEC_JSON => serde_json::from_slice(bytes).map_err(|e| format!("JSON: {e}")),
        CODEC_PROTO => RawEntry::decode(bytes).map_err(|e| format!("protobuf: {e}")).and_then(entry_from_raw),
        other => Err(format!(
            "unknown entry codec {other}: this fencelock reads codecs {CODEC_JSON} (JSON) and {CODEC_PROTO} \
             (protobuf fencelock.log.v1); the entry was written by a newer version"
        )),
    };
    decoded.map_err(|why| CodecError::Corrupt { record: record(), why })
}

/// `fencelock.log.v1.Entry` with its `normal` input left as bytes: the same
/// fields and tags as `log.proto`'s `Entry` (a message field is
/// length-delimited, as bytes are), so that an input's bytes can be kept
/// when it is decoded and written as they are when it is encoded.
/// `tests::the_raw_entry_is_log_protos_entry` holds it to the generated type.
#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(message, optional, tag = "1")]
    log_id: Option<pb::LogId>,
    #[prost(oneof = "RawPayload", tags = "2, 3, 4")]
    payload: Option<RawPayload>,
}

/// The payload of a [`RawEntry`]: `log.proto`'s `Entry.payload`, `normal` as bytes.
#[derive(Clone, PartialEq, prost::Oneof)]
enum RawPayload {
    #[prost(message, tag = "2")]
    Blank(pb::Blank),
    /// A `fencelock.log.v1.Input`, encoded.
    #[prost(bytes = "bytes", tag = "3")]
    Normal(Bytes),
    #[prost(bytes = "vec", tag = "4")]
    MembershipJson(Vec<u8>),
}

fn log_id_to_pb(id: &LogId<NodeId>) -> pb::LogId {
    pb::LogId { term: id.leader_id.term, node_id: id.leader_id.node_id, index: id.index }
}

/// `payload` as it is encoded: a normal one's input from its bytes if it
/// has them.
fn raw_payload(payload: &EntryPayload<TypeConfig>) -> Result<RawPayload, CodecError> {
    Ok(match payload {
        EntryPayload::Blank => RawPayload::Blank(pb::Blank {}),
        EntryPayload::Membership(m) => RawPayload::MembershipJson(serde_json::to_vec(m)?),
        EntryPayload::Normal(d) => RawPayload::Normal(match d.encoded() {
            Some(bytes) => bytes.clone(),
            None => encode_input(d.input())?,
        }),
    })
}

/// `input` as a `fencelock.log.v1.Input`.
fn encode_input(input: &Input) -> Result<Bytes, CodecError> {
    Ok(input_to_pb(input)?.encode_to_vec().into())
}

fn entry_from_raw(e: RawEntry) -> Result<Entry<TypeConfig>, String> {
    let id = need(e.log_id, "an entry without its log id")?;
    let log_id = LogId::new(CommittedLeaderId::new(id.term, id.node_id), id.index);
    let payload = match need(e.payload, "an entry without a payload")? {
        RawPayload::Blank(_) => EntryPayload::Blank,
        RawPayload::Normal(bytes) => {
            let input = pb::Input::decode(bytes.as_ref()).map_err(|e| format!("protobuf: {e}"))?;
            EntryPayload::Normal(LogInput::with_encoded(input_from_pb(input)?, bytes))
        }
        RawPayload::MembershipJson(json) => {
            EntryPayload::Membership(serde_json::from_slice(&json).map_err(|e| format!("membership: {e}"))?)
        }
    };
    Ok(Entry { log_id, payload })
}

fn input_to_pb(input: &Input) -> Result<pb::Input, CodecError> {
    use pb::input::Kind;
    let kind = match input {
        Input::LeaderStart { now, token_floor, cluster_id } => Kind::LeaderStart(pb::LeaderStart {
            now: *now,
            token_floor: *token_floor,
            cluster_id: cluster_id.map(|c| pb::ClusterId { hi: (c.0 >> 64) as u64, lo: c.0 as u64 }),
        }),
        Input::Batch { now, cmds } => {
            let cmds = cmds.iter().map(command_to_pb).collect::<Result<_, _>>()?;
            Kind::Batch(pb::Batch { now: *now, cmds })
        }
    };
    Ok(pb::Input { kind: Some(kind) })
}

fn input_from_pb(input: pb::Input) -> Result<Input, String> {
    use pb::input::Kind;
    Ok(match need(input.kind, "an input without a kind")? {
        Kind::LeaderStart(l) => Input::LeaderStart {
            now: l.now,
            token_floor: l.token_floor,
            cluster_id: l.cluster_id.map(|c| ClusterId((u128::from(c.hi) << 64) | u128::from(c.lo))),
        },
        Kind::Batch(b) => {
            let cmds = b
                .cmds
                .into_iter()
                .enumerate()
                .map(|(i, c)| command_from_pb(c).map_err(|why| format!("command {i} of the batch: {why}")));
            Input::Batch { now: b.now, cmds: cmds.collect::<Result<_, _>>()? }
        }
    })
}

fn command_to_pb(cmd: &Command) -> Result<pb::Command, CodecError> {
    use pb::command::Kind;
    let kind = match cmd {
        Command::GrantLease { req, ttl_ms, id } => {
            Kind::GrantLease(pb::GrantLease { req: req.0, ttl_ms: *ttl_ms, id: id.map(|l| l.0) })
        }
        Command::KeepAlive { req, lease } => Kind::KeepAlive(pb::KeepAlive { req: req.0, lease: lease.0 }),
        Command::Revoke { req, lease } => Kind::Revoke(pb::Revoke { req: req.0, lease: lease.0 }),
        Command::Acquire(a) => Kind::Acquire(acquire_to_pb(a)),
        Command::Release { req, lease, lock, token } => {
            Kind::Release(pb::Release { req: req.0, lease: lease.0, lock: lock.clone(), token: token.0 })
        }
        Command::Downgrade { req, lease, lock, token } => {
            Kind::Downgrade(pb::Downgrade { req: req.0, lease: lease.0, lock: lock.clone(), token: token.0 })
        }
        Command::SetValue { req, lease, lock, token, value } => Kind::SetValue(pb::SetValue {
            req: req.0,
            lease: lease.0,
            lock: lock.clone(),
            token: token.0,
            value: value.clone(),
        }),
        Command::CompleteSlot { req, lease, lock, token, slot, exit_code } => Kind::CompleteSlot(pb::CompleteSlot {
            req: req.0,
            lease: lease.0,
            lock: lock.clone(),
            token: token.0,
            slot: slot.clone(),
            exit_code: *exit_code,
        }),
        Command::CancelWait { req, lease, lock } => {
            Kind::CancelWait(pb::CancelWait { req: req.0, lease: lease.0, lock: lock.clone() })
        }
        Command::As { caller, cmd } => Kind::AsCaller(Box::new(pb::AsCaller {
            caller: Some(pb::Caller { name: caller.name.clone(), admin: caller.admin }),
            cmd: Some(Box::new(command_to_pb(cmd)?)),
        })),
        Command::Policy(change) => Kind::PolicyJson(serde_json::to_vec(change)?),
        Command::Resize { lock, permits } => Kind::Resize(pb::Resize { lock: lock.clone(), permits: *permits }),
        Command::ReportRefusal { lock, refused, highest, resource } => Kind::ReportRefusal(pb::ReportRefusal {
            lock: lock.clone(),
            refused: refused.0,
            highest: highest.0,
            resource: resource.clone(),
        }),
    };
    Ok(pb::Command { kind: Some(kind) })
}

fn command_from_pb(cmd: pb::Command) -> Result<Command, String> {
    use pb::command::Kind;
    Ok(match need(cmd.kind, "a command without a kind")? {
        Kind::GrantLease(g) => Command::GrantLease { req: RequestId(g.req), ttl_ms: g.ttl_ms, id: g.id.map(LeaseId) },
        Kind::KeepAlive(k) => Command::KeepAlive { req: RequestId(k.req), lease: LeaseId(k.lease) },
        Kind::Revoke(r) => Command::Revoke { req: RequestId(r.req), lease: LeaseId(r.lease) },
        Kind::Acquire(a) => Command::Acquire(acquire_from_pb(a)?),
        Kind::Release(r) => {
            Command::Release { req: RequestId(r.req), lease: LeaseId(r.lease), lock: r.lock, token: Token(r.token) }
        }
        Kind::Downgrade(d) => {
            Command::Downgrade { req: RequestId(d.req), lease: LeaseId(d.lease), lock: d.lock, token: Token(d.token) }
        }
        Kind::SetValue(s) => Command::SetValue {
            req: RequestId(s.req),
            lease: LeaseId(s.lease),
            lock: s.lock,
            token: Token(s.token),
            value: s.value,
        },
        Kind::CompleteSlot(c) => Command::CompleteSlot {
            req: RequestId(c.req),
            lease: LeaseId(c.lease),
            lock: c.lock,
            token: Token(c.token),
            slot: c.slot,
            exit_code: c.exit_code,
        },
        Kind::CancelWait(c) => Command::CancelWait { req: RequestId(c.req), lease: LeaseId(c.lease), lock: c.lock },
        Kind::AsCaller(a) => {
            let caller = need(a.caller, "an As without its caller")?;
            let cmd = need(a.cmd, "an As without its command")?;
            let cmd = command_from_pb(*cmd).map_err(|why| format!("inside an As: {why}"))?;
            Command::As { caller: Caller { name: caller.name, admin: caller.admin }, cmd: Box::new(cmd) }
        }
        Kind::PolicyJson(json) => {
            Command::Policy(serde_json::from_slice(&json).map_err(|e| format!("policy change: {e}"))?)
        }
        Kind::Resize(r) => Command::Resize { lock: r.lock, permits: r.permits },
        Kind::ReportRefusal(r) => Command::ReportRefusal {
            lock: r.lock,
            refused: Token(r.refused),
            highest: Token(r.highest),
            resource: r.resource,
        },
    })
}

fn acquire_to_pb(a: &Acquire) -> pb::Acquire {
    let mode = match a.mode {
        Mode::Exclusive => pb::Mode::Exclusive,
        Mode::Shared => pb::Mode::Shared,
    };
    pb::Acquire {
        req: a.req.0,
        lease: a.lease.0,
        lock: a.lock.clone(),
        wait_ms: a.wait_ms,
        lock_delay_ms: a.lock_delay_ms,
        identity: a.identity.clone(),
        value: a.value.clone(),
        mode: mode.into(),
        weight: (a.weight != 1).then_some(a.weight),
        permits: a.permits,
        hold_at_least_ms: a.hold_at_least_ms,
        once_per: a.once_per.clone(),
        also: a.also.clone(),
    }
}

fn acquire_from_pb(a: pb::Acquire) -> Result<Acquire, String> {
    let mode = match pb::Mode::try_from(a.mode) {
        Ok(pb::Mode::Exclusive) => Mode::Exclusive,
        Ok(pb::Mode::Shared) => Mode::Shared,
        Err(_) => return Err(format!("an acquire of unknown mode {}", a.mode)),
    };
    Ok(Acquire {
        req: RequestId(a.req),
        lease: LeaseId(a.lease),
        lock: a.lock,
        wait_ms: a.wait_ms,
        lock_delay_ms: a.lock_delay_ms,
        identity: a.identity,
        value: a.value,
        mode,
        weight: a.weight.unwrap_or(1),
        permits: a.permits,
        hold_at_least_ms: a.hold_at_least_ms,
        once_per: a.once_per,
        also: a.also,
    })
}

/// `part`, or the error `missing` when it is absent.
fn need<T>(part: Option<T>, missing: &str) -> Result<T, String> {
    part.ok_or_else(|| missing.to_owned())
}

#[cfg(test)]
mod tests;
