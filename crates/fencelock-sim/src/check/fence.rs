//! INV-FENCE: the resource never carries out an act that the fence's rule
//! ([`fencelock_fence::Marks::admit`]) refuses given the acts it carried out
//! before: a write whose token is lower than one it accepted, a read whose
//! token is lower than the last accepted write's (0 stale accepts). With
//! exclusive holders only, that is "no token below one accepted before"; with
//! readers it is INV-15 at the resource: readers act together, in any token
//! order, but never beside a newer writer's writes, and a writer never acts
//! after a newer holder did. Permit uses are not fenced and not judged. Each
//! multi-lock's register ([`Act::WriteOn`]) is judged on its own, by its own
//! lock's tokens.
//! Conclusive only if an act made after a pause (Kleppmann's case) was
//! rejected in the run: the fence must have had something to stop.

use std::collections::BTreeMap;

use fencelock_fence::Marks;

use super::Verdict;
use crate::{event::EventKind, report::Report, wire::Act};

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-FENCE");
    let mut marks: BTreeMap<u8, Marks> = BTreeMap::new();
    let (mut accepted, mut rejected, mut paused_rejected, mut stale_accepts, mut reads) = (0, 0, 0, 0, 0);
    for e in &r.events {
        let EventKind::Acted { client, token, act, accepted: ok, after_pause } = e.kind else {
            continue;
        };
        let Some((register, access)) = act.fenced() else {
            continue;
        };
        if !ok {
            rejected += 1;
            paused_rejected += u64::from(after_pause);
            continue;
        }
        accepted += 1;
        reads += u64::from(act == Act::Read);
        match Marks::admit(marks.get(&register).copied(), access, token.0) {
            Ok(after) => {
                marks.insert(register, after);
            }
            Err(stale) => {
                stale_accepts += 1;
                v.violate(format!(
                    "at {} ms the resource accepted client-{client}'s {act:?} with token {token}: {stale} (after pause: {after_pause})",
                    e.at_ms
                ));
            }
        }
    }
    v.evidence = vec![
        ("accepted", accepted),
        ("accepted_reads", reads),
        ("rejected", rejected),
        ("rejected_after_pause", paused_rejected),
        ("stale_accepts", stale_accepts),
    ];
    v.require(paused_rejected > 0, "no act made after a pause was rejected: the Kleppmann case did not happen");
    v
}

#[cfg(test)]
mod tests {
    use fencelock_core::Token;

    use super::*;
    use crate::{config::SimConfig, event::Event};

    fn report(acts: &[(Act, u64)]) -> Report {
        let acted = |(i, &(act, token)): (usize, &(Act, u64))| Event {
            at_ms: i as u64,
            kind: EventKind::Acted { client: i, token: Token(token), act, accepted: true, after_pause: false },
        };
        Report::new(SimConfig::new(1), acts.iter().enumerate().map(acted).collect(), Vec::new(), Vec::new(), None)
    }

    /// INV-FENCE with readers: reads in any token order are no stale accept;
    /// a read below the last write's token, or a write below a read's, is.
    #[test]
    fn accepted_acts_are_judged_by_the_fence_rule() {
        let ok = check(&report(&[(Act::Write, 1), (Act::Read, 3), (Act::Read, 2), (Act::Use, 1), (Act::Write, 4)]));
        assert!(ok.violations.is_empty(), "{}", ok.summary());
        let stale_read = check(&report(&[(Act::Read, 2), (Act::Write, 3), (Act::Read, 2)]));
        assert_eq!(stale_read.violations.len(), 1, "{}", stale_read.summary());
        assert!(stale_read.violations[0].contains("stale read: token 2 < last write token 3"));
        let stale_write = check(&report(&[(Act::Read, 5), (Act::Write, 4)]));
        assert_eq!(stale_write.violations.len(), 1, "{}", stale_write.summary());
    }

    /// INV-FENCE per register: a multi-lock's register judges only its own
    /// lock's tokens.
    #[test]
    fn each_register_is_judged_on_its_own() {
        let ok = check(&report(&[(Act::WriteOn(0), 5), (Act::WriteOn(1), 3), (Act::Write, 1)]));
        assert!(ok.violations.is_empty(), "{}", ok.summary());
        let stale = check(&report(&[(Act::WriteOn(1), 5), (Act::WriteOn(1), 3)]));
        assert_eq!(stale.violations.len(), 1, "{}", stale.summary());
    }
}
