//! Check R1, "fenced reads see the last accepted write" (read-write locks,
//! issue 18; not in the reference): in shared mode readers take the lock
//! shared and read the object with their token, writers read-modify-write it
//! under the exclusive lock. Whether the storage carried out a read it should
//! have refused (a token below the last write's) is C3's: it replays the
//! audit log through the fence's rule for reads and writes, and the history
//! for reads and writes that succeeded after a higher write completed. R1
//! checks what the reads it carried out returned.
//!
//! Rules:
//! * The audit log, in `seq` order, says which operations the storage carried
//!   out (accepted or unfenced); a `PUT` stored what its worker sent, which
//!   the history knows: the value that worker's cycle read, plus its append
//!   (the write with the `PUT`'s token; none or several such writes, and what
//!   the object holds is unknown until the next `PUT` whose body is known).
//! * Each `GET` carried out is the history's read with its token (the k-th
//!   `GET` of a token, the k-th read with it that may have reached the
//!   storage, by start): if that read returned a value, it must be the
//!   object as the last `PUT` before it left it. A read that returned
//!   nothing (unknown) proves nothing.
//! * A backend without fencing tokens sends one token for every grant, so
//!   reads cannot be told apart: its violations are findings.

use std::collections::HashMap;

use fencelock_fence::storage::{AuditEntry, Outcome as AuditOutcome};

use super::run::{without, Operation, Res, Run, Tally};
use super::{Check, Status};
use crate::history::Op;

const R1: &str = "fenced reads see the last accepted write";

/// R1: every read the storage carried out returned the object as the last
/// write it carried out before it left it.
pub(super) fn r1_fenced_reads(r: &Run<'_>) -> Check {
    let carried_out = |a: &&&AuditEntry| a.outcome != AuditOutcome::Stale;
    if !r.audit.iter().filter(carried_out).any(|a| a.op == "GET") {
        return without("R1", R1, Status::Inconclusive, "no fenced read reached the storage".into());
    }
    let ix = ReadIndex::new(r);
    let mut tally = Tally::default();
    let mut object: Option<Vec<String>> = Some(Vec::new());
    let mut last: Option<&AuditEntry> = None;
    let mut taken: HashMap<u64, usize> = HashMap::new();
    for a in r.audit.iter().copied().filter(|a| a.outcome != AuditOutcome::Stale) {
        match a.op.as_str() {
            "PUT" => (object, last) = (ix.body_of(a.token), Some(a)),
            "DELETE" => (object, last) = (Some(Vec::new()), Some(a)),
            "GET" => {
                let k = taken.entry(a.token).or_default();
                let read = ix.reads.get(&a.token).and_then(|v| v.get(*k));
                *k += 1;
                let (Some(read), Some(want)) = (read, object.as_ref()) else { continue };
                let Some(saw) = read.done.and_then(|d| d.value.as_ref()).filter(|_| read.res() == Res::Ok) else {
                    continue;
                };
                if saw != want {
                    tally.add(|| {
                        format!(
                            "{} (audit #{}) saw {}; the last write carried out before it ({}) left {}",
                            r.describe(read),
                            a.seq,
                            summary(saw),
                            last.map_or("none".into(), |l| format!("audit #{}, {} token {}", l.seq, l.op, l.token)),
                            summary(want)
                        )
                    });
                }
            }
            // RESET moves the mark, not the object.
            _ => {}
        }
    }
    tally.judge("R1", R1, !r.info.fencing)
}

/// The history's reads and writes by token.
struct ReadIndex<'a> {
    /// Reads that may have reached the storage (ok or unknown), by token, by start.
    reads: HashMap<u64, Vec<Operation<'a>>>,
    /// Writes that may have been carried out (ok or unknown), by token.
    writes: HashMap<u64, Vec<Operation<'a>>>,
    /// Ok reads' values by worker cycle.
    cycle_reads: HashMap<(&'a str, u64), &'a [String]>,
}

impl<'a> ReadIndex<'a> {
    fn new(r: &Run<'a>) -> Self {
        let mut ix = ReadIndex { reads: HashMap::new(), writes: HashMap::new(), cycle_reads: HashMap::new() };
        for o in r.ops.iter().filter(|o| o.res() != Res::Fail) {
            let Some(token) = o.token() else { continue };
            match o.invoke.f {
                Op::Read => ix.reads.entry(token).or_default().push(*o),
                Op::Write => ix.writes.entry(token).or_default().push(*o),
                _ => {}
            }
            if let Some(v) = o.done.and_then(|d| d.value.as_deref()).filter(|_| o.is(Op::Read, Res::Ok)) {
                ix.cycle_reads.insert((o.p(), o.seq()), v);
            }
        }
        for v in ix.reads.values_mut() {
            v.sort_by_key(|o| o.start());
        }
        ix
    }

    /// What a `PUT` with `token` stored: its cycle's read and its append,
    /// if exactly one write of the history has that token.
    fn body_of(&self, token: u64) -> Option<Vec<String>> {
        let [w] = self.writes.get(&token)?.as_slice() else { return None };
        let mut body = self.cycle_reads.get(&(w.p(), w.seq()))?.to_vec();
        body.push(w.append()?.to_string());
        Some(body)
    }
}

/// A value in a few words: its length and its last entry.
fn summary(v: &[String]) -> String {
    match v.last() {
        Some(l) => format!("{} entries ending {l:?}", v.len()),
        None => "nothing".into(),
    }
}
