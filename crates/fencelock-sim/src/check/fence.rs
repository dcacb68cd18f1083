//! INV-FENCE: the resource never accepts a write whose token is lower than one it
//! accepted before (0 stale accepts). Conclusive only if a write made after a
//! pause (Kleppmann's case) was rejected in the run: the fence must have had
//! something to stop.

use fencelock_core::Token;

use super::Verdict;
use crate::{event::EventKind, report::Report};

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-FENCE");
    let mut highest: Option<Token> = None;
    let (mut accepted, mut rejected, mut paused_rejected, mut stale_accepts) = (0, 0, 0, 0);
    for e in &r.events {
        let EventKind::Write { client, token, accepted: ok, after_pause } = e.kind else {
            continue;
        };
        if !ok {
            rejected += 1;
            paused_rejected += u64::from(after_pause);
            continue;
        }
        accepted += 1;
        if let Some(h) = highest.filter(|h| token < *h) {
            stale_accepts += 1;
            v.violate(format!(
                "at {} ms the resource accepted client-{client}'s write with token {token} after accepting token {h} (after pause: {after_pause})",
                e.at_ms
            ));
        }
        highest = highest.max(Some(token));
    }
    v.evidence = vec![
        ("accepted", accepted),
        ("rejected", rejected),
        ("rejected_after_pause", paused_rejected),
        ("stale_accepts", stale_accepts),
    ];
    v.require(paused_rejected > 0, "no write made after a pause was rejected: the Kleppmann case did not happen");
    v
}
