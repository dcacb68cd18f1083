//! INV-MULTI, the design's INV-18 (never a partial multi-lock) on what
//! clients believe and what the server granted:
//! - a client told of a multi-acquire's grant believes it holds one token per
//!   lock asked, never a strict subset (the `HoldAll` event);
//! - the server granted exactly those tokens, to that lease and request, in
//!   one step (the same instant, one log entry), in the order asked. A grant
//!   the server ended as `Cancelled` is left out: a `CancelWait` is written
//!   only for a caller that went away before its outcome reached it, so no
//!   client held that grant, and a retry of the request that arrives after the
//!   cancel is a new wait, granted anew (seed 48 with 16 clients: a network
//!   hold delivered an attempt and its connection's close together, and the
//!   retry came after). A client that did believe a cancelled grant still
//!   fails here (its tokens are not the server's) and in INV-EXCL;
//! - every one of those tokens is above every token granted before (INV-2
//!   per lock: INV-TOKENS checks it over all live grants, multi ones
//!   included; here the order inside a multi-grant is checked).
//!
//! Holders of one multi-lock never overlap (INV-15 per lock) is INV-EXCL's;
//! a multi-acquire that never ends its wait would stop the grants, which
//! INV-HEAL reports. Conclusive only in a [`Workload::Mixed`] run where a
//! multi-acquire was granted after queueing and two clients' multi-acquires
//! named their locks in crossed orders.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_core::{LeaseId, Millis, ReleaseCause, RequestId, Token};

use super::Verdict;
use crate::{config::Workload, event::EventKind, report::Report};

/// What the server granted to one `(lease, req)`: `(at_ms, token, queued)` each.
type Granted = BTreeMap<(LeaseId, RequestId), Vec<(Millis, Token, bool)>>;

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-MULTI");
    if r.config.workload != Workload::Mixed {
        v.evidence = vec![("multi_grants", 0)];
        return v;
    }
    let granted = server_grants(r);
    let (mut held, mut queued) = (0, 0);
    let mut orders: BTreeSet<Vec<u8>> = BTreeSet::new();
    for e in &r.events {
        let EventKind::HoldAll { client, lease, req, locks, tokens } = &e.kind else {
            continue;
        };
        held += 1;
        orders.insert(locks.clone());
        let server = granted.get(&(*lease, *req)).map_or(&[][..], Vec::as_slice);
        queued += u64::from(server.iter().any(|(_, _, q)| *q));
        let what = format!("at {} ms client-{client} (lease {lease}, req {})", e.at_ms, req.0);
        check_one(&mut v, &what, locks, tokens, server);
    }
    let crossed = crossed(&orders);
    v.evidence = vec![("multi_grants", held), ("queued_multi_grants", queued), ("crossed_orders", crossed)];
    v.require(queued > 0, "no multi-acquire was granted after waiting");
    v.require(crossed > 0, "no two multi-acquires named the same locks in crossed orders");
    v
}

/// One multi-grant as the client believes it, against the server's grants.
fn check_one(v: &mut Verdict, what: &str, locks: &[u8], tokens: &[Token], server: &[(Millis, Token, bool)]) {
    if tokens.len() != locks.len() {
        v.violate(format!(
            "{what} believes it holds {} tokens {tokens:?} of the {} locks {locks:?} it asked for",
            tokens.len(),
            locks.len()
        ));
    }
    let server_tokens: Vec<Token> = server.iter().map(|(_, t, _)| *t).collect();
    if server_tokens != tokens {
        v.violate(format!("{what} holds tokens {tokens:?}, the server granted {server_tokens:?}"));
    }
    if server.windows(2).any(|w| w[0].0 != w[1].0 || w[1].1 <= w[0].1) {
        v.violate(format!("{what}: the server's grants {server:?} are not one step in increasing token order"));
    }
}

/// The live grants by `(lease, req)`, without those the server cancelled.
fn server_grants(r: &Report) -> Granted {
    let cancelled: BTreeSet<Token> = r
        .events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Released { token, cause: ReleaseCause::Cancelled, .. } => Some(token),
            _ => None,
        })
        .collect();
    let mut granted = Granted::new();
    for e in &r.events {
        if let EventKind::Granted { lease, req, token, queued } = e.kind {
            if !cancelled.contains(&token) {
                granted.entry((lease, req)).or_default().push((e.at_ms, token, queued));
            }
        }
    }
    granted
}

/// How many pairs of orders asked take the same locks in a different order.
fn crossed(orders: &BTreeSet<Vec<u8>>) -> u64 {
    let sorted = |o: &Vec<u8>| {
        let mut s = o.clone();
        s.sort_unstable();
        s
    };
    let all: Vec<&Vec<u8>> = orders.iter().collect();
    let pairs = all.iter().enumerate().flat_map(|(i, a)| all[i + 1..].iter().map(move |b| (*a, *b)));
    pairs.filter(|(a, b)| a != b && sorted(a) == sorted(b)).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::SimConfig, event::Event};

    fn granted(at_ms: Millis, req: u64, token: u64) -> Event {
        let kind = EventKind::Granted { lease: LeaseId(1), req: RequestId(req), token: Token(token), queued: true };
        Event { at_ms, kind }
    }

    fn hold_all(at_ms: Millis, req: u64, locks: Vec<u8>, tokens: &[u64]) -> Event {
        let tokens = tokens.iter().map(|t| Token(*t)).collect();
        Event { at_ms, kind: EventKind::HoldAll { client: 0, lease: LeaseId(1), req: RequestId(req), locks, tokens } }
    }

    fn report(events: Vec<Event>) -> Report {
        Report::new(SimConfig::new(3).with_workload(Workload::Mixed), events, Vec::new(), Vec::new(), None)
    }

    /// INV-18: whole multi-grants in crossed orders hold.
    #[test]
    fn whole_multi_grants_hold() {
        let r = report(vec![
            granted(10, 1, 4),
            granted(10, 1, 5),
            hold_all(12, 1, vec![0, 1], &[4, 5]),
            granted(30, 2, 6),
            granted(30, 2, 7),
            hold_all(31, 2, vec![1, 0], &[6, 7]),
        ]);
        let v = check(&r);
        assert!(v.holds(), "{}", v.summary());
        assert_eq!(v.evidence("crossed_orders"), 1);
    }

    /// INV-18: a client told of only one of its two grants (the
    /// `PartialMultiPush` mutant's push) believes it holds a strict subset.
    #[test]
    fn a_strict_subset_believed_is_a_violation() {
        let r = report(vec![granted(10, 1, 4), granted(10, 1, 5), hold_all(12, 1, vec![0, 1], &[4])]);
        let v = check(&r);
        assert!(v.violations.iter().any(|s| s.contains("holds 1 tokens")), "{}", v.summary());
    }

    fn cancelled(at_ms: Millis, token: u64) -> Event {
        Event {
            at_ms,
            kind: EventKind::Released { lease: LeaseId(1), token: Token(token), cause: ReleaseCause::Cancelled },
        }
    }

    /// INV-18 with a cancel: the grant of an attempt whose caller went away is
    /// cancelled in the step that made it; the retry is granted anew and the
    /// client holds the new grant, whole. Believing the cancelled grant is a
    /// violation.
    #[test]
    fn a_cancelled_grant_then_a_new_one_holds_and_believing_the_cancelled_one_does_not() {
        let events = vec![
            granted(10, 1, 4),
            granted(10, 1, 5),
            cancelled(10, 4),
            cancelled(10, 5),
            granted(17, 1, 8),
            granted(17, 1, 9),
        ];
        let new = [events.clone(), vec![hold_all(20, 1, vec![0, 1], &[8, 9])]].concat();
        let v = check(&report(new));
        assert!(v.violations.is_empty(), "{}", v.summary());
        let old = [events, vec![hold_all(20, 1, vec![0, 1], &[4, 5])]].concat();
        let v = check(&report(old));
        assert!(v.violations.iter().any(|s| s.contains("the server granted [Token(8), Token(9)]")), "{}", v.summary());
    }

    /// INV-18: grants of one multi-acquire made one by one (at different
    /// instants, as each lock freed) are a violation even if the client got all.
    #[test]
    fn grants_made_one_by_one_are_a_violation() {
        let r = report(vec![granted(10, 1, 4), granted(25, 1, 5), hold_all(26, 1, vec![0, 1], &[4, 5])]);
        let v = check(&r);
        assert!(v.violations.iter().any(|s| s.contains("not one step")), "{}", v.summary());
    }
}
