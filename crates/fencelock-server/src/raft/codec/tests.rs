//! Tests of the entry codecs: every command and every optional field
//! round-trips through codec 2 to the same JSON as the original; malformed
//! payloads are [`DbError::Corrupt`] errors naming the record, never panics.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use fencelock_core::policy::{Rule, Verb};
use fencelock_core::PolicyChange;
use openraft::Membership;

use super::*;
use crate::raft::db::{self, encode};
use crate::raft::db_error::DbError;
use crate::raft::record;
use crate::raft::Member;

fn name() -> String {
    "raft_log[7]".into()
}

fn entry(payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
    Entry { log_id: LogId::new(CommittedLeaderId::new(3, 2), 7), payload }
}

fn batch(cmds: Vec<Command>) -> Entry<TypeConfig> {
    entry(EntryPayload::Normal(Input::Batch { now: 123_456, cmds }.into()))
}

/// The JSON text of `e` (text, not `serde_json::Value`, which cannot hold a
/// cluster id above 2^64).
fn json(e: &Entry<TypeConfig>) -> String {
    serde_json::to_string(e).expect("an entry serializes")
}

/// Encodes `e` with codec 2, decodes it and returns the decoded entry.
fn round_trip(e: &Entry<TypeConfig>) -> Entry<TypeConfig> {
    let bytes = encode_entry(e).expect("encodes");
    decode_entry(&name, CODEC_PROTO, &bytes).expect("decodes")
}

/// The invariant of the codec: what codec 2 decodes serializes to the same
/// JSON as the entry that was encoded (JSON is the reference form).
fn assert_round_trips(e: &Entry<TypeConfig>) {
    assert_eq!(json(&round_trip(e)), json(e), "{e:?}");
}

fn acquire() -> Acquire {
    Acquire::exclusive(RequestId(11), LeaseId(0xdead_beef_cafe), "jobs/nightly", 0)
}

/// The plain acquire, then one with each optional field set alone, then one
/// with all of them set (and weight 0, a value the default must not hide).
fn acquires() -> Vec<Acquire> {
    let set: Vec<fn(&mut Acquire)> = vec![
        |a| a.wait_ms = 30_000,
        |a| a.lock_delay_ms = 5_000,
        |a| a.identity = "host:1234 ünïcode".into(),
        |a| a.value = vec![0, 255, 1, 2],
        |a| a.mode = Mode::Shared,
        |a| a.weight = 3,
        |a| a.weight = 0,
        |a| a.permits = 5,
        |a| a.hold_at_least_ms = 86_400_000,
        |a| a.once_per = "2026-11-26".into(),
        |a| a.also = vec!["b".into(), "c".into()],
    ];
    let mut out = vec![acquire()];
    out.extend(set.iter().map(|f| {
        let mut a = acquire();
        f(&mut a);
        a
    }));
    let mut all = acquire();
    set.iter().for_each(|f| f(&mut all));
    out.push(all);
    out
}

fn policy_changes() -> Vec<PolicyChange> {
    vec![
        PolicyChange::PutRole {
            name: "workers".into(),
            rules: vec![Rule { prefix: "jobs/".into(), verbs: vec![Verb::Acquire, Verb::Read] }],
        },
        PolicyChange::DeleteRole { name: "workers".into() },
        PolicyChange::DeleteIdentity { name: "ci".into() },
    ]
}

/// Every variant of [`Command`], each optional field set and unset, and
/// `As` around each of them (admin and not).
fn commands() -> Vec<Command> {
    let (req, lease, token) = (RequestId(u64::MAX), LeaseId(1), Token(1 << 62));
    let mut cmds = vec![
        Command::GrantLease { req, ttl_ms: 10_000, id: None },
        Command::GrantLease { req, ttl_ms: 10_000, id: Some(LeaseId(0)) },
        Command::GrantLease { req, ttl_ms: 10_000, id: Some(LeaseId(u64::MAX)) },
        Command::KeepAlive { req, lease },
        Command::Revoke { req, lease },
        Command::Release { req, lease, lock: "a".into(), token },
        Command::Downgrade { req, lease, lock: "a".into(), token },
        Command::SetValue { req, lease, lock: "a".into(), token, value: Vec::new() },
        Command::SetValue { req, lease, lock: "a".into(), token, value: b"leader=10.0.0.1".to_vec() },
        Command::CompleteSlot { req, lease, lock: "a".into(), token, slot: "h13".into(), exit_code: 0 },
        Command::CompleteSlot { req, lease, lock: "a".into(), token, slot: "h13".into(), exit_code: -9 },
        Command::CompleteSlot { req, lease, lock: "".into(), token, slot: "".into(), exit_code: i32::MIN },
        Command::CancelWait { req, lease, lock: "a".into() },
        Command::Resize { lock: "sem".into(), permits: 0 },
        Command::Resize { lock: "sem".into(), permits: 9 },
        Command::ReportRefusal { lock: "a".into(), refused: Token(5), highest: token, resource: "orders-42".into() },
        Command::ReportRefusal { lock: "".into(), refused: Token(0), highest: Token(u64::MAX), resource: "".into() },
    ];
    cmds.extend(acquires().into_iter().map(Command::Acquire));
    cmds.extend(policy_changes().into_iter().map(Command::Policy));
    let wrapped: Vec<Command> = cmds
        .iter()
        .enumerate()
        .map(|(i, c)| Command::As {
            caller: Caller { name: format!("caller-{i}"), admin: i % 2 == 0 },
            cmd: Box::new(c.clone()),
        })
        .collect();
    cmds.extend(wrapped);
    // Not valid for the engine (an As inside an As), but JSON decodes it: so must codec 2.
    cmds.push(Command::As {
        caller: Caller { name: "x".into(), admin: false },
        cmd: Box::new(cmds[cmds.len() - 1].clone()),
    });
    cmds
}

/// Which variant `c` is; a new variant fails to compile here until
/// [`commands`] covers it.
fn variant(c: &Command) -> usize {
    match c {
        Command::GrantLease { .. } => 0,
        Command::KeepAlive { .. } => 1,
        Command::Revoke { .. } => 2,
        Command::Acquire(_) => 3,
        Command::Release { .. } => 4,
        Command::Downgrade { .. } => 5,
        Command::SetValue { .. } => 6,
        Command::CompleteSlot { .. } => 7,
        Command::CancelWait { .. } => 8,
        Command::As { .. } => 9,
        Command::Policy(_) => 10,
        Command::Resize { .. } => 11,
        Command::ReportRefusal { .. } => 12,
    }
}

#[test]
fn the_cases_cover_every_command_variant() {
    let seen: BTreeSet<usize> = commands().iter().map(variant).collect();
    assert_eq!(seen, (0..13).collect());
}

/// Each command alone in a batch, and all of them in one batch, decode to
/// the JSON of the original.
#[test]
fn every_command_round_trips_to_the_same_json() {
    for c in commands() {
        assert_round_trips(&batch(vec![c]));
    }
    assert_round_trips(&batch(commands()));
    assert_round_trips(&batch(Vec::new()));
}

#[test]
fn every_other_payload_round_trips_to_the_same_json() {
    let cases = [
        EntryPayload::Blank,
        EntryPayload::Normal(Input::leader_start(0).into()),
        EntryPayload::Normal(
            Input::LeaderStart {
                now: u64::MAX,
                token_floor: fencelock_core::token_floor(1_795_000_000),
                cluster_id: Some(ClusterId(u128::MAX - 0x1234)),
            }
            .into(),
        ),
        EntryPayload::Normal(Input::LeaderStart { now: 5, token_floor: 0, cluster_id: Some(ClusterId(7)) }.into()),
        EntryPayload::Membership(membership(&[1, 2, 3])),
    ];
    for payload in cases {
        assert_round_trips(&entry(payload));
    }
    let mut e = batch(Vec::new());
    e.log_id = LogId::new(CommittedLeaderId::new(u64::MAX, u64::MAX), u64::MAX);
    assert_round_trips(&e);
}

fn membership(voters: &[u64]) -> Membership<u64, Member> {
    let nodes: BTreeMap<u64, Member> = voters
        .iter()
        .map(|id| (*id, Member::with_peer(format!("127.0.0.1:{}", 7000 + id), Some(format!("10.0.0.{id}:7100")))))
        .collect();
    Membership::new(vec![voters.iter().copied().collect()], nodes)
}

/// Codec 1 still reads what the JSON path wrote.
#[test]
fn a_json_entry_decodes_with_codec_1() {
    let e = batch(commands());
    let bytes = serde_json::to_vec(&e).unwrap();
    assert_eq!(json(&decode_entry(&name, CODEC_JSON, &bytes).unwrap()), json(&e));
}

/// Old stored entries (frame V1 and bare JSON, both JSON) still read through
/// the log store's entry decoding; new ones are frame V2, codec 2.
#[test]
fn old_json_records_and_new_coded_records_read_back() {
    let e = batch(commands());
    let v1 = encode(&e).unwrap();
    assert_eq!(v1[0], record::FRAME_V1);
    let bare = serde_json::to_vec(&e).unwrap();
    let v2 = db::encode_entry(&e).unwrap();
    assert_eq!(v2[..2], [record::FRAME_V2, CODEC_PROTO]);
    for stored in [v1, bare, v2] {
        assert_eq!(json(&db::decode_entry(7, &stored).unwrap()), json(&e));
    }
}

/// A flipped byte anywhere in a stored codec-2 entry is caught (by the CRC,
/// or for the frame tag by the format check), naming the record.
#[test]
fn a_flipped_byte_of_a_coded_entry_is_caught() {
    let stored = db::encode_entry(&batch(commands()[..8].to_vec())).unwrap();
    for i in 0..stored.len() {
        let mut bad = stored.clone();
        bad[i] ^= 0x5a;
        let err = db::decode_entry(7, &bad).expect_err("a flipped entry must not decode");
        assert!(matches!(err, DbError::Corrupt { .. }) && err.to_string().contains("raft_log[7]"), "{err}");
    }
}

/// `e` as the generated `fencelock.log.v1.Entry`, built field by field from
/// `log.proto`'s own types (not through [`RawEntry`]).
fn entry_to_pb(e: &Entry<TypeConfig>) -> Result<pb::Entry, CodecError> {
    use pb::entry::Payload;
    let payload = match &e.payload {
        EntryPayload::Blank => Payload::Blank(pb::Blank {}),
        EntryPayload::Normal(d) => Payload::Normal(input_to_pb(d.input())?),
        EntryPayload::Membership(m) => Payload::MembershipJson(serde_json::to_vec(m)?),
    };
    Ok(pb::Entry { log_id: Some(log_id_to_pb(&e.log_id)), payload: Some(payload) })
}

/// Every kind of entry: a batch of every command, an empty one, the leader
/// starts, a blank and a membership.
fn every_kind() -> Vec<Entry<TypeConfig>> {
    vec![
        batch(commands()),
        batch(Vec::new()),
        entry(EntryPayload::Normal(Input::leader_start(0).into())),
        entry(EntryPayload::Normal(
            Input::LeaderStart { now: 5, token_floor: 9, cluster_id: Some(ClusterId(u128::MAX - 7)) }.into(),
        )),
        entry(EntryPayload::Blank),
        entry(EntryPayload::Membership(membership(&[1, 2, 3]))),
    ]
}

/// `RawEntry` is `log.proto`'s `Entry` on the wire: each kind of entry
/// encodes to the bytes the generated type makes of it, and those decode to it.
#[test]
fn the_raw_entry_is_log_protos_entry() {
    for e in every_kind() {
        let generated = entry_to_pb(&e).unwrap().encode_to_vec();
        assert_eq!(encode_entry(&e).unwrap(), generated, "{e:?}");
        assert_eq!(json(&decode_entry(&name, CODEC_PROTO, &generated).unwrap()), json(&e));
    }
}

/// An input keeps the bytes it was encoded to (the leader's log append) and
/// decoded from (a follower's receipt), and the entry is then written from
/// them, not encoded again: bytes a newer leader added to an input (here a
/// field this build does not know, which a fresh encoding would drop)
/// reach the log as they came, and still decode to the same input.
#[test]
fn an_input_keeps_its_bytes_and_is_written_from_them() {
    for mut e in every_kind() {
        let written = encode_and_keep(&mut e).unwrap();
        if let EntryPayload::Normal(d) = &e.payload {
            assert_eq!(d.encoded(), Some(&encode_input(d.input()).unwrap()), "{e:?} keeps its bytes");
        }
        let received = decode_entry(&name, CODEC_PROTO, &written).unwrap();
        assert_eq!(encode_entry(&received).unwrap(), written);
    }
    let e = batch(commands());
    let mut input = encode_input(match &e.payload {
        EntryPayload::Normal(d) => d.input(),
        _ => unreachable!(),
    })
    .unwrap()
    .to_vec();
    input.extend_from_slice(&[15 << 3, 42]); // field 15, varint 42: unknown here
    let raw = RawEntry { log_id: Some(log_id_to_pb(&e.log_id)), payload: Some(RawPayload::Normal(input.into())) };
    let sent = raw.encode_to_vec();
    let received = decode_entry(&name, CODEC_PROTO, &sent).unwrap();
    assert_eq!(json(&received), json(&e));
    assert_eq!(encode_entry(&received).unwrap(), sent, "written as received");
    assert_ne!(encode_entry(&e).unwrap(), sent, "a fresh encoding drops the unknown field");
}

/// `pb` encoded and decoded as codec 2 must be a Corrupt error naming the
/// record and mentioning `why`.
fn assert_refused(pb: &pb::Entry, why: &str) {
    assert_refused_bytes(&pb.encode_to_vec(), why);
}

fn assert_refused_bytes(bytes: &[u8], why: &str) {
    let err = decode_entry(&name, CODEC_PROTO, bytes).expect_err(why);
    assert!(
        matches!(&err, CodecError::Corrupt { record, why: w } if record == "raft_log[7]" && w.contains(why)),
        "{err}"
    );
}

fn valid_pb() -> pb::Entry {
    entry_to_pb(&batch(vec![Command::Acquire(acquire())])).unwrap()
}

fn first_command(e: &mut pb::Entry) -> &mut pb::Command {
    match &mut e.payload {
        Some(pb::entry::Payload::Normal(pb::Input { kind: Some(pb::input::Kind::Batch(b)) })) => &mut b.cmds[0],
        other => panic!("not a batch: {other:?}"),
    }
}

/// What the JSON path rejects, codec 2 rejects: missing required parts,
/// unknown enum values, strings that are not UTF-8, unknown codecs.
#[test]
fn an_incomplete_or_invalid_entry_is_refused_as_corrupt() {
    let mut e = valid_pb();
    e.log_id = None;
    assert_refused(&e, "without its log id");

    let mut e = valid_pb();
    e.payload = None;
    assert_refused(&e, "without a payload");

    let mut e = valid_pb();
    e.payload = Some(pb::entry::Payload::Normal(pb::Input { kind: None }));
    assert_refused(&e, "input without a kind");

    let mut e = valid_pb();
    first_command(&mut e).kind = None;
    assert_refused(&e, "command 0 of the batch: a command without a kind");

    let mut e = valid_pb();
    if let Some(pb::command::Kind::Acquire(a)) = &mut first_command(&mut e).kind {
        a.mode = 7;
    }
    assert_refused(&e, "unknown mode 7");

    for (caller, cmd, why) in [
        (None, Some(Box::new(valid_cmd())), "without its caller"),
        (Some(pb::Caller::default()), None, "without its command"),
    ] {
        let mut e = valid_pb();
        first_command(&mut e).kind = Some(pb::command::Kind::AsCaller(Box::new(pb::AsCaller { caller, cmd })));
        assert_refused(&e, why);
    }

    let mut e = valid_pb();
    first_command(&mut e).kind = Some(pb::command::Kind::PolicyJson(b"{\"op\":\"nope\"}".to_vec()));
    assert_refused(&e, "policy change");

    let mut e = valid_pb();
    e.payload = Some(pb::entry::Payload::MembershipJson(b"[]".to_vec()));
    assert_refused(&e, "membership");

    // A refusal report (issue 36) whose lock name and resource are not UTF-8.
    let report = |lock: &str, resource: &str| {
        let mut e = valid_pb();
        first_command(&mut e).kind = Some(pb::command::Kind::ReportRefusal(pb::ReportRefusal {
            lock: lock.into(),
            refused: 5,
            highest: 9,
            resource: resource.into(),
        }));
        e.encode_to_vec()
    };
    for (at, bytes) in
        [("lock-of-a-report", report("lock-of-a-report", "r")), ("storage-key", report("l", "storage-key"))]
    {
        let mut bytes = bytes;
        let i = bytes.windows(at.len()).position(|w| w == at.as_bytes()).expect("the string is in the encoding");
        bytes[i] = 0xff;
        assert_refused_bytes(&bytes, "protobuf");
    }

    // The lock name "jobs/nightly" with its first byte made invalid UTF-8.
    let mut bytes = valid_pb().encode_to_vec();
    let at = bytes.windows(12).position(|w| w == b"jobs/nightly").expect("the name is in the encoding");
    bytes[at] = 0xff;
    assert_refused_bytes(&bytes, "protobuf");

    let err = decode_entry(&name, 3, &valid_pb().encode_to_vec()).expect_err("codec 3 is unknown");
    assert!(err.to_string().contains("unknown entry codec 3"), "{err}");
}

fn valid_cmd() -> pb::Command {
    first_command(&mut valid_pb()).clone()
}

/// xorshift64: deterministic pseudo-random bytes for the fuzz-ish tests.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Well-framed (valid CRC) but arbitrary payloads never panic: each decodes
/// or is a Corrupt error naming the record. Random bytes, and valid
/// encodings with random bytes changed (which mostly still parse as
/// protobuf, so reach the checks past the parser).
#[test]
fn arbitrary_payloads_with_a_valid_crc_never_panic() {
    let valid = entry_to_pb(&batch(commands())).unwrap().encode_to_vec();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let (mut refused, mut decoded) = (0, 0);
    for round in 0..4000 {
        let payload: Vec<u8> = match round % 2 {
            0 => (0..next(&mut state) % 64).map(|_| next(&mut state) as u8).collect(),
            _ => {
                let mut p = valid.clone();
                for _ in 0..1 + next(&mut state) % 4 {
                    let at = (next(&mut state) % p.len() as u64) as usize;
                    p[at] = next(&mut state) as u8;
                }
                p
            }
        };
        match db::decode_entry(7, &record::seal_coded(CODEC_PROTO, &payload)) {
            Ok(_) => decoded += 1,
            Err(DbError::Corrupt { record, .. }) if record == "raft_log[7]" => refused += 1,
            Err(other) => panic!("not a Corrupt error naming the record: {other}"),
        }
    }
    assert!(refused > 0 && decoded > 0, "refused {refused}, decoded {decoded}");
}

/// Deep nesting (an As in an As ...) is refused by the decoder's recursion
/// limit, not by a stack overflow.
#[test]
fn deeply_nested_commands_are_refused_without_overflow() {
    let mut cmd = valid_cmd();
    for _ in 0..200 {
        cmd = pb::Command {
            kind: Some(pb::command::Kind::AsCaller(Box::new(pb::AsCaller {
                caller: Some(pb::Caller::default()),
                cmd: Some(Box::new(cmd)),
            }))),
        };
    }
    let mut e = valid_pb();
    *first_command(&mut e) = cmd;
    assert_refused(&e, "protobuf");
}

/// A typical entry: a batch of 16 acquires, releases and keep-alives.
fn typical() -> Entry<TypeConfig> {
    let cmds = (0..16u64)
        .map(|i| {
            let (req, lease) = (RequestId(1_000_000 + i), LeaseId(0x7f3a_91c4_55e0_0000 + i));
            let lock = format!("orders/shard-{:02}", i % 8);
            match i % 3 {
                0 => Command::Acquire(Acquire {
                    req,
                    lease,
                    lock,
                    wait_ms: 10_000,
                    identity: format!("worker-{i}:4242"),
                    ..acquire()
                }),
                1 => Command::Release { req, lease, lock, token: Token(3_853_000_000_000_000_000 + i) },
                _ => Command::KeepAlive { req, lease },
            }
        })
        .collect();
    let mut e = batch(cmds);
    e.log_id = LogId::new(CommittedLeaderId::new(4, 1), 1_234_567);
    e
}

/// Size and encode+decode time of a typical entry, JSON against codec 2.
/// A measurement, not a check of speed: run it with
/// `cargo nextest run -p fencelock-server --run-ignored only codec_size_and_speed --no-capture`
/// (add `--release` for meaningful times).
#[test]
#[ignore = "a measurement: run by hand"]
#[allow(clippy::disallowed_methods)] // a benchmark measures time
fn codec_size_and_speed() {
    let e = typical();
    let n = 20_000;
    let measure = |codec: u8| {
        let start = Instant::now();
        let mut size = 0;
        for _ in 0..n {
            let bytes = match codec {
                CODEC_JSON => serde_json::to_vec(&e).unwrap(),
                _ => encode_entry(&e).unwrap(),
            };
            size = bytes.len();
            let back = decode_entry(&name, codec, &bytes).unwrap();
            assert_eq!(back.log_id, e.log_id);
        }
        (size, start.elapsed() / n)
    };
    let (json_size, json_time) = measure(CODEC_JSON);
    let (pb_size, pb_time) = measure(CODEC_PROTO);
    println!("typical entry (batch of 16): JSON {json_size} B, {json_time:?} per encode+decode");
    println!("typical entry (batch of 16): protobuf {pb_size} B, {pb_time:?} per encode+decode");
    assert_eq!(json(&round_trip(&e)), json(&e));
}

/// The segment log's codec byte means the same as the codec ids here.
#[test]
fn the_segment_log_json_codec_is_codec_1() {
    assert_eq!(crate::raft::wal::format::CODEC_JSON, CODEC_JSON);
}

/// A segment of records of index `1..`, each of (codec, payload).
fn segment_file(dir: &std::path::Path, records: &[(u8, Vec<u8>)]) {
    use crate::raft::wal::{format, segments};
    let mut bytes = format::header(1).to_vec();
    for (i, (codec, payload)) in records.iter().enumerate() {
        let index = i as u64 + 1;
        format::push_record(&mut bytes, format::RecordId { index, term: 3, batch: index }, *codec, payload);
    }
    std::fs::write(dir.join(segments::segment_name(1)), bytes).unwrap();
}

fn at(index: u64, mut e: Entry<TypeConfig>) -> Entry<TypeConfig> {
    e.log_id = LogId::new(CommittedLeaderId::new(3, 2), index);
    e
}

/// The segment log reads records of either codec, by their codec tag (a log
/// written as JSON before codec 2, then appended to), and names a codec it
/// does not know.
#[test]
fn the_segment_log_reads_json_and_coded_records() {
    let dir = tempfile::tempdir().unwrap();
    let entries =
        [at(1, batch(commands())), at(2, entry(EntryPayload::Membership(membership(&[1, 2])))), at(3, typical())];
    let records = [
        (CODEC_JSON, serde_json::to_vec(&entries[0]).unwrap()),
        (CODEC_PROTO, encode_entry(&entries[1]).unwrap()),
        (CODEC_PROTO, encode_entry(&entries[2]).unwrap()),
    ];
    segment_file(dir.path(), &records);
    let read = crate::raft::wal::segments::read(dir.path(), None).unwrap();
    assert_eq!(read.iter().map(json).collect::<Vec<_>>(), entries.iter().map(json).collect::<Vec<_>>());

    let dir = tempfile::tempdir().unwrap();
    segment_file(dir.path(), &[(9, encode_entry(&entries[0]).unwrap())]);
    let err = crate::raft::wal::segments::read(dir.path(), None).expect_err("codec 9 is unknown");
    assert!(err.to_string().contains("unknown entry codec 9"), "{err}");
}
