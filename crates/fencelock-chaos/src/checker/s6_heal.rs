//! Check S6, "heal: a fenced write soon after every fault" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).
//!
//! Rules where the reference leaves room:
//! * S6: a fault is healed by the earliest completion of a write `ok` invoked
//!   after the fault's end; the run's end is the final read (else the last
//!   event). A fault with no such write is ignored if the run ended within
//!   the bound, a violation otherwise. A slow heal after a fault that
//!   restarted a backend without durable tokens is a finding: its tokens went
//!   back, and the fence refuses every write until they pass the mark again.

use super::run::{without, Res, Run, Tally};
use super::{Check, Status, NS_PER_MS};
use crate::history::{Event, Op};

const S6: &str = "heal: a fenced write soon after every fault";

/// S6: after each fault's end, some write invoked after it succeeds within
/// the heal bound. Also returns the slowest heal in ms.
pub(super) fn s6_heal(r: &Run<'_>) -> (Check, Option<u64>) {
    let ends: Vec<&Event> = r.notes(Op::Fault).filter(|e| e.phase.as_deref() == Some("end")).collect();
    if ends.is_empty() {
        return (without("S6", S6, Status::NotApplicable, "no fault ended in this run".into()), None);
    }
    let healed = FirstWrite::new(r);
    let bound = r.info.heal_bound_ms.saturating_add(r.info.heal_slack_ms).saturating_mul(NS_PER_MS);
    let (mut tally, mut evaluated, mut slowest, mut local) = (Tally::default(), 0, None::<u64>, false);
    for e in ends {
        let late = match healed.after(e.t) {
            Some(done) => {
                evaluated += 1;
                let ms = (done - e.t) / NS_PER_MS;
                slowest = Some(slowest.map_or(ms, |s| s.max(ms)));
                (done - e.t > bound).then(|| format!("first write ok after {ms} ms"))
            }
            None if r.end.saturating_sub(e.t) > bound => {
                evaluated += 1;
                Some(format!("no write ok in the {} ms left", (r.end - e.t) / NS_PER_MS))
            }
            None => None,
        };
        if let Some(late) = late {
            let start = fault_start(r, e);
            let tokens_went_back = r.info.fencing && !r.info.durable_tokens && r.outage_within(start, e.t);
            local |= !tokens_went_back;
            let why = if tokens_went_back { " (a restart of a backend without durable tokens)" } else { "" };
            tally.add(|| format!("fault {} ended {}: {late}{why}", fault_name(e), r.at(e.t)));
        }
    }
    if evaluated == 0 {
        let why = "every fault ended within the heal bound of the run's end".to_string();
        return (without("S6", S6, Status::Inconclusive, why), slowest);
    }
    (tally.judge("S6", S6, !local), slowest)
}

/// When the fault that ended with `end` began: the last start before it on
/// the same target.
fn fault_start(r: &Run<'_>, end: &Event) -> u64 {
    r.notes(Op::Fault)
        .filter(|s| s.phase.as_deref() == Some("start") && s.t <= end.t && s.target == end.target)
        .map(|s| s.t)
        .last()
        .unwrap_or(end.t)
}

fn fault_name(e: &Event) -> String {
    format!("{} on {}", e.fault.as_deref().unwrap_or("?"), e.target.as_deref().unwrap_or("?"))
}

/// Ok writes by invoke time, with the earliest completion from each on.
struct FirstWrite {
    starts: Vec<u64>,
    min_end_from: Vec<u64>,
}

impl FirstWrite {
    fn new(r: &Run<'_>) -> Self {
        let mut w: Vec<(u64, u64)> =
            r.ops.iter().filter(|o| o.is(Op::Write, Res::Ok)).map(|o| (o.start(), o.end())).collect();
        w.sort_unstable();
        let mut min_end_from = vec![u64::MAX; w.len()];
        let mut m = u64::MAX;
        for (i, &(_, end)) in w.iter().enumerate().rev() {
            m = m.min(end);
            min_end_from[i] = m;
        }
        FirstWrite { starts: w.into_iter().map(|(s, _)| s).collect(), min_end_from }
    }

    /// The earliest completion of an ok write invoked after `t`.
    fn after(&self, t: u64) -> Option<u64> {
        let i = self.starts.partition_point(|&s| s <= t);
        self.min_end_from.get(i).copied()
    }
}
