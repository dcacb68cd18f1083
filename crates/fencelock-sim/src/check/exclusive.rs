//! INV-EXCL: at any virtual instant at most one client believes it holds the lock
//! within its own conservative lease deadline.
//!
//! A client's belief in a grant runs from when it learned of the grant to when
//! it sent the release or its deadline passed, whichever came first (the `Hold`
//! and `HoldEnd` events). Two beliefs of different clients that overlap are a
//! violation. Conclusive only if the lock passed to another client after a
//! holder's deadline ran out (the case where two could believe at once).

use std::collections::BTreeMap;

use fencelock_core::{Millis, Token};

use super::Verdict;
use crate::{
    event::{EventKind, HoldEnd},
    report::Report,
};

/// One client's belief that it holds `token`, over `[from, to)`.
#[derive(Debug, Clone, Copy)]
struct Belief {
    client: usize,
    token: Token,
    from: Millis,
    to: Millis,
    expired: bool,
}

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-EXCL");
    let mut beliefs = beliefs(r);
    beliefs.sort_by_key(|b| (b.from, b.to, b.client));
    check_overlaps(&mut v, &beliefs);
    let handovers = handovers_after_expiry(&beliefs);
    v.evidence = vec![
        ("beliefs", beliefs.len() as u64),
        ("ended_by_deadline", beliefs.iter().filter(|b| b.expired).count() as u64),
        ("handovers_after_expiry", handovers),
    ];
    v.require(handovers > 0, "the lock never passed to another client after a holder's deadline ran out");
    v
}

fn beliefs(r: &Report) -> Vec<Belief> {
    let mut open: BTreeMap<(usize, Token), Millis> = BTreeMap::new();
    let mut done = Vec::new();
    for e in &r.events {
        match e.kind {
            EventKind::Hold { client, token, .. } => {
                open.insert((client, token), e.at_ms);
            }
            EventKind::HoldEnd { client, token, why } => {
                let from = open.remove(&(client, token)).unwrap_or(e.at_ms);
                let expired = why == HoldEnd::DeadlinePassed;
                done.push(Belief { client, token, from, to: e.at_ms.max(from), expired });
            }
            _ => {}
        }
    }
    // Beliefs still open when the run ended last until its end.
    let end = r.end_ms();
    let open = open.into_iter().map(|((client, token), from)| Belief { client, token, from, to: end, expired: false });
    done.extend(open);
    done
}

/// Sweep in start order against the latest-ending belief so far.
fn check_overlaps(v: &mut Verdict, sorted: &[Belief]) {
    let mut latest: Option<Belief> = None;
    for b in sorted {
        if let Some(l) = latest.filter(|l| l.client != b.client && b.from < l.to && b.from < b.to) {
            v.violate(format!(
                "client-{} believed it held token {} over [{}, {}) ms while client-{} believed it held token {} over [{}, {}) ms",
                l.client, l.token, l.from, l.to, b.client, b.token, b.from, b.to
            ));
        }
        if latest.is_none_or(|l| b.to > l.to) {
            latest = Some(*b);
        }
    }
}

/// How often a belief that ended by its deadline was followed by another
/// client's belief.
fn handovers_after_expiry(sorted: &[Belief]) -> u64 {
    let pairs = sorted.windows(2);
    pairs.filter(|w| w[0].expired && w[1].client != w[0].client).count() as u64
}
