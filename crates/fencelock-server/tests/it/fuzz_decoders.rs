//! Fuzzing every decoder a peer or a client reaches (issue 14, part 1): Raft
//! messages, snapshot data, log entries and the session stream.
//!
//! A seeded mutation fuzzer (no libFuzzer: that would need a C++ build): each
//! target starts from seeds (built here from real values, plus the files of
//! `tests/fuzz/<target>/`, the committed corpus) and feeds mutations of them
//! (bit flips, interesting bytes and numbers, cuts, repeats, splices) to the
//! code a received message goes through. What must hold for every input:
//! - no panic, whatever the bytes (the server never panics on input);
//! - a snapshot that [`snapshot_rx::check`] accepts is consistent and, when it
//!   would be installed, does not lower the token counter (INV-2);
//! - a log entry that decodes applies to the engine without a panic and never
//!   lowers its token counter (INV-2), and the engine stays consistent.
//!
//! `.ci/run` runs a short campaign (`FUZZ_ITERS` per target, default below);
//! run a longer one by hand with e.g.
//! `FENCELOCK_FUZZ_ITERS=200000 FENCELOCK_FUZZ_SEED=7 cargo nextest run -p fencelock-server fuzz_decoders::`.
//! A failure prints the seed and the input; add the input to the corpus.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, RwLock};

use fencelock_core::{Acquire, Command, Engine, Input, LeaseId, RequestId, Token};
use fencelock_proto::v1 as pb;
use fencelock_server::raft::{snapshot_rx, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
use prost::Message as _;

/// Mutations per target in CI.
const FUZZ_ITERS: u64 = 5000;

fn iters() -> u64 {
    std::env::var("FENCELOCK_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(FUZZ_ITERS)
}

fn seed() -> u64 {
    std::env::var("FENCELOCK_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// xorshift64*: deterministic, so a failure is reproduced from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[&[u8]] = &[
    b"0",
    b"-1",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9223372036854775807",
    b"1e999",
    b"null",
    b"true",
    b"\"\"",
    b"[]",
    b"{}",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"\xff\xfe",
];

/// One mutation of `input`: half the time, when it is JSON, of one value inside
/// it (so that most mutations still decode and reach the checks behind the
/// decoder); otherwise of its bytes.
fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(2) == 0 {
        if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(input) {
            for _ in 0..1 + rng.below(3) {
                mutate_value(rng, &mut value);
            }
            return serde_json::to_vec(&value).unwrap();
        }
    }
    mutate_bytes(rng, input, others)
}

/// Changes one value somewhere inside `v`: a number or string to an interesting
/// one, or an array or object loses, repeats or swaps a member.
fn mutate_value(rng: &mut Rng, v: &mut serde_json::Value) {
    use serde_json::Value;
    let numbers = [0u64, 1, 2, u64::MAX, i64::MAX as u64, u32::MAX as u64 + 1, 1 << 53];
    let strings = ["", "a", "\u{0}", "\n", "b", &"x".repeat(600)];
    match v {
        Value::Array(a) if !a.is_empty() && rng.below(3) > 0 => {
            let i = rng.below(a.len());
            mutate_value(rng, &mut a[i]);
        }
        Value::Array(a) if !a.is_empty() => {
            let (i, j, n) = (rng.below(a.len()), rng.below(a.len()), rng.below(3));
            match n {
                0 => drop(a.remove(i)),
                1 => a.push(a[i].clone()),
                _ => a.swap(i, j),
            }
        }
        Value::Object(o) if !o.is_empty() && rng.below(4) > 0 => {
            let key = o.keys().nth(rng.below(o.len())).cloned().unwrap();
            mutate_value(rng, o.get_mut(&key).unwrap());
        }
        Value::Object(o) if !o.is_empty() => {
            let key = o.keys().nth(rng.below(o.len())).cloned().unwrap();
            o.remove(&key);
        }
        Value::Number(_) => *v = Value::from(numbers[rng.below(numbers.len())]),
        Value::String(_) => *v = Value::from(strings[rng.below(strings.len())]),
        Value::Bool(b) => *b = !*b,
        _ => *v = Value::Null,
    }
}

/// One mutation of `input`'s bytes.
fn mutate_bytes(rng: &mut Rng, input: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut v = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = [0u8, 0xff, b'"', b'{', b'}', b'[', b']', b',', b':', b'9', b'-'][rng.below(11)];
            }
            2 => v.truncate(at),
            3 => {
                let s = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(at..at, s.iter().copied());
            }
            4 if !v.is_empty() => {
                // Replace a run of digits (a number) with an interesting value.
                let start = (at..v.len()).find(|&i| v[i].is_ascii_digit()).unwrap_or(v.len());
                let end = (start..v.len()).find(|&i| !v[i].is_ascii_digit()).unwrap_or(v.len());
                let s = INTERESTING[rng.below(6)];
                v.splice(start..end, s.iter().copied());
            }
            5 if !v.is_empty() => {
                let from = rng.below(v.len());
                let to = (from + 1 + rng.below(64)).min(v.len());
                let chunk = v[from..to].to_vec();
                v.splice(at..at, chunk);
            }
            _ if !others.is_empty() => {
                let other = &others[rng.below(others.len())];
                let from = rng.below(other.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    v
}

/// What a target made of one input.
enum Verdict {
    /// Refused by the decoder or the check (an error, which is fine).
    Refused,
    /// Decoded and accepted: the rules after decoding were checked on it.
    Accepted,
}
use Verdict::*;

/// Feeds `iters()` mutations of the seeds (and the seeds themselves) to `target`,
/// which must not panic; it returns an error for a broken rule. At least one in
/// `min_accepted` inputs must get past the decoder, so that the campaign also
/// tests what comes after decoding (a fuzzer that only makes garbage proves
/// little).
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, min_accepted: u64, target: impl Fn(&[u8]) -> Result<Verdict, String>) {
    let mut corpus = seeds;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz").join(name);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            corpus.push(std::fs::read(e.path()).unwrap());
        }
    }
    assert!(!corpus.is_empty(), "{name}: no seeds");
    let mut rng = Rng(seed().wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let inputs = corpus.clone().into_iter().chain((0..iters()).map(|_| {
        let base = &corpus[rng.below(corpus.len())];
        mutate(&mut rng, base, &corpus)
    }));
    let (mut total, mut accepted) = (0u64, 0u64);
    for (i, input) in inputs.enumerate() {
        total += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| target(&input)));
        let failure = match outcome {
            Ok(Ok(Refused)) => continue,
            Ok(Ok(Accepted)) => {
                accepted += 1;
                continue;
            }
            Ok(Err(broken)) => broken,
            Err(_) => "panicked".to_string(),
        };
        panic!("{name}: input {i} (seed {}): {failure}\ninput: {:?}", seed(), String::from_utf8_lossy(&input));
    }
    println!("{name}: {total} inputs, {accepted} got past decoding");
    assert!(accepted * min_accepted >= total, "{name}: only {accepted} of {total} inputs got past decoding");
}

// --- seeds: real values of every decoded type -------------------------------

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn commands() -> Vec<Command> {
    let acq = |req, lock: &str, wait_ms| {
        Command::Acquire(Acquire {
            req: RequestId(req),
            lease: LeaseId(1),
            lock: lock.into(),
            wait_ms,
            lock_delay_ms: 50,
            identity: String::new(),
            value: Vec::new(),
            mode: fencelock_core::Mode::Exclusive,
            weight: 1,
            permits: 0,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: Vec::new(),
        })
    };
    vec![
        Command::GrantLease { req: RequestId(1), ttl_ms: 1000, id: None },
        Command::GrantLease { req: RequestId(2), ttl_ms: 1000, id: None },
        acq(3, "a", 0),
        Command::Acquire(Acquire {
            req: RequestId(4),
            lease: LeaseId(2),
            lock: "a".into(),
            wait_ms: 500,
            lock_delay_ms: 0,
            identity: "host-b:42".into(),
            value: b"10.0.0.2:7000".to_vec(),
            mode: fencelock_core::Mode::Exclusive,
            weight: 1,
            permits: 0,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: Vec::new(),
        }),
        Command::KeepAlive { req: RequestId(5), lease: LeaseId(1) },
        Command::Release { req: RequestId(6), lease: LeaseId(1), lock: "a".into(), token: Token(1) },
        acq(7, "b", 0),
        Command::CancelWait { req: RequestId(8), lease: LeaseId(2), lock: "b".into() },
        Command::Revoke { req: RequestId(9), lease: LeaseId(2) },
    ]
}

fn inputs() -> Vec<Input> {
    vec![
        Input::Batch { now: 10, cmds: commands() },
        Input::LeaderStart { now: 5, token_floor: 1 << 40, cluster_id: Some(fencelock_core::ClusterId(7)) },
        Input::Batch { now: 2000, cmds: vec![] },
    ]
}

fn entries() -> Vec<Entry<TypeConfig>> {
    let mut entries: Vec<Entry<TypeConfig>> = inputs()
        .into_iter()
        .enumerate()
        .map(|(i, input)| Entry { log_id: log_id(2, i as u64 + 3), payload: EntryPayload::Normal(input.into()) })
        .collect();
    entries.push(Entry { log_id: log_id(2, 1), payload: EntryPayload::Blank });
    let members = Membership::new(vec![[1u64, 2, 3].into()], None);
    entries.push(Entry { log_id: log_id(2, 2), payload: EntryPayload::Membership(members) });
    entries
}

/// An engine with held locks, a queue and a few leases.
fn busy_engine() -> Engine {
    let mut e = Engine::new();
    e.step(&Input::Batch { now: 0, cmds: commands()[..4].to_vec() });
    e
}

fn membership() -> StoredMembership<u64, fencelock_server::raft::Member> {
    let nodes = std::collections::BTreeMap::from([(1u64, fencelock_server::raft::Member::new("127.0.0.1:7070"))]);
    let m = Membership::new(vec![[1u64].into()], nodes);
    StoredMembership::new(Some(log_id(1, 1)), m)
}

fn meta(at: LogId<u64>) -> SnapshotMeta<u64, fencelock_server::raft::Member> {
    SnapshotMeta { last_log_id: Some(at), last_membership: membership(), snapshot_id: "s".into() }
}

fn snapshot_data(at: LogId<u64>, engine: &Engine) -> Vec<u8> {
    let payload = serde_json::json!({ "last_applied": at, "last_membership": membership(), "engine": engine });
    serde_json::to_vec(&payload).unwrap()
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

// --- targets ------------------------------------------------------------------

/// Raft messages as the peer service decodes them (`RaftPayload.json`).
#[test]
fn raft_messages() {
    let ae = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(2, 1),
        prev_log_id: Some(log_id(2, 2)),
        entries: entries(),
        leader_commit: Some(log_id(2, 3)),
    };
    let vote = VoteRequest::<u64>::new(Vote::new(3, 2), Some(log_id(2, 5)));
    let snap = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(2, 1),
        meta: meta(log_id(2, 9)),
        offset: 0,
        data: snapshot_data(log_id(2, 9), &busy_engine()),
        done: true,
    };
    let seeds = vec![json(&ae), json(&vote), json(&snap)];
    fuzz("raft_messages", seeds, 50, |bytes| {
        let ae = serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(bytes).is_ok();
        let vote = serde_json::from_slice::<VoteRequest<u64>>(bytes).is_ok();
        let snap = serde_json::from_slice::<InstallSnapshotRequest<TypeConfig>>(bytes).is_ok();
        Ok(if ae || vote || snap { Accepted } else { Refused })
    });
}

/// Snapshot data, through the check every received snapshot passes first.
#[test]
fn snapshot_data_check() {
    let local = busy_engine();
    let ours = local.stats().token_counter;
    let shared = Arc::new(RwLock::new(local.clone()));
    let at = log_id(2, 9);
    let seeds = vec![snapshot_data(at, &local), snapshot_data(at, &Engine::new())];
    fuzz("snapshot_data", seeds, 50, |bytes| {
        let verdict = snapshot_rx::check(&meta(at), bytes, Some(log_id(2, 3)), &shared);
        let payload = serde_json::from_slice::<serde_json::Value>(bytes).ok();
        let engine = payload.and_then(|p| serde_json::from_value::<Engine>(p["engine"].clone()).ok());
        let Some(engine) = engine else {
            return match verdict {
                Ok(()) => Err("accepted a snapshot whose engine does not decode".into()),
                Err(_) => Ok(Refused),
            };
        };
        if verdict.is_ok() {
            engine.check_consistency().map_err(|e| format!("accepted an inconsistent engine: {e}"))?;
            if engine.stats().token_counter < ours {
                return Err("accepted a snapshot that lowers the token counter".into());
            }
        }
        Ok(Accepted)
    });
}

/// Log entries, decoded as the log store and AppendEntries decode them, then
/// applied as the state machine applies them.
#[test]
fn log_entries_apply() {
    let base = busy_engine();
    let seeds = entries().iter().map(json).collect();
    fuzz("log_entries", seeds, 50, |bytes| {
        let Ok(entry) = serde_json::from_slice::<Entry<TypeConfig>>(bytes) else { return Ok(Refused) };
        let EntryPayload::Normal(input) = entry.payload else { return Ok(Accepted) };
        let mut engine = base.clone();
        let before = engine.stats().token_counter;
        engine.step(input.input());
        if engine.stats().token_counter < before {
            return Err("an entry lowered the token counter".into());
        }
        engine.check_consistency().map_err(|e| format!("an entry left the engine inconsistent: {e}"))?;
        Ok(Accepted)
    });
}

/// The session stream's requests (protobuf, as tonic decodes them).
#[test]
fn session_stream_requests() {
    use pb::session_request::Op;
    let ops = [
        Op::GrantLease(pb::GrantLeaseRequest { request_id: 1, ttl_ms: 1000 }),
        Op::Acquire(pb::AcquireRequest {
            request_id: 2,
            lease_id: 1,
            lock: "a".into(),
            wait_ms: 500,
            lock_delay_ms: 0,
            identity: "host-b:42".into(),
            value: b"10.0.0.2:7000".to_vec(),
            mode: pb::LockMode::Shared as i32,
            permits: 4,
            hold_at_least_ms: 0,
            once_per: String::new(),
            also: vec!["b".into()],
            weight: 2,
            attempt: 0,
        }),
        Op::Release(pb::ReleaseRequest { request_id: 3, lease_id: 1, lock: "a".into(), token: 7 }),
        Op::KeepAlive(pb::KeepAliveRequest { request_id: 4, lease_id: 1 }),
    ];
    let seeds = ops
        .into_iter()
        .enumerate()
        .map(|(i, op)| pb::SessionRequest { op_id: i as u64, op: Some(op) }.encode_to_vec())
        .collect();
    fuzz("session_requests", seeds, 50, |bytes| {
        let Ok(req) = pb::SessionRequest::decode(bytes) else { return Ok(Refused) };
        // What decodes re-encodes to something that decodes to the same.
        let again = pb::SessionRequest::decode(req.encode_to_vec().as_slice()).map_err(|e| e.to_string())?;
        match again == req {
            true => Ok(Accepted),
            false => Err("a decoded request does not survive a round trip".into()),
        }
    });
}
