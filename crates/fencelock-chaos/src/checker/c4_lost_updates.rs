//! Check C4, "no lost updates" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).

use std::collections::{HashMap, HashSet};

use super::run::{without, Operation, Res, Run, Tally};
use super::{Check, Status};
use crate::history::Op;

const C4: &str = "no lost updates";

/// C4: the final value holds every acknowledged append, nothing twice, and
/// nothing that was not written (or whose write certainly failed).
pub(super) fn c4_lost_updates(r: &Run<'_>) -> Check {
    let Some(fin) = r.notes(Op::FinalRead).filter_map(|e| e.value.as_ref()).last() else {
        return without("C4", C4, Status::Inconclusive, "no final read of the object".into());
    };
    let mut writes: HashMap<&str, Operation<'_>> = HashMap::new();
    for o in r.ops.iter().filter(|o| o.invoke.f == Op::Write) {
        if let Some(id) = o.append() {
            writes.entry(id).or_insert(*o);
        }
    }
    let mut in_final: HashMap<&str, u64> = HashMap::new();
    for id in fin {
        *in_final.entry(id.as_str()).or_default() += 1;
    }
    let mut tally = Tally::default();
    let mut acked: Vec<&Operation<'_>> = writes.values().filter(|o| o.res() == Res::Ok).collect();
    acked.sort_by_key(|o| o.start());
    for o in acked {
        if !in_final.contains_key(o.append().unwrap_or_default()) {
            tally.add(|| {
                format!(
                    "lost update: {} appended {:?}, missing from the final value",
                    r.describe(o),
                    o.append().unwrap_or_default()
                )
            });
        }
    }
    let mut reported = HashSet::new();
    for id in fin.iter().map(String::as_str) {
        if !reported.insert(id) {
            continue;
        }
        let n = in_final[id];
        if n > 1 {
            tally.add(|| format!("{id:?} appears {n} times in the final value"));
        }
        match writes.get(id) {
            None => tally.add(|| format!("{id:?} is in the final value but was never written")),
            Some(o) if o.res() == Res::Fail => {
                let why = o.done.and_then(|d| d.error.clone()).unwrap_or_default();
                tally.add(|| format!("{id:?} is in the final value but its write failed: {} ({why})", r.describe(o)));
            }
            Some(_) => {}
        }
    }
    tally.judge("C4", C4, !r.info.fencing)
}
