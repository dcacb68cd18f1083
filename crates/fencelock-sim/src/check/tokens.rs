//! INV-TOKENS: grant tokens are unique and strictly increasing in grant order,
//! across server crash-restarts; and what was granted survives a restart:
//! - the live grants (engine `Granted` effects as they happened, in order) have
//!   strictly increasing tokens;
//! - replaying the durable log gives exactly the same grants (nothing granted was
//!   lost, nothing granted twice);
//! - every grant a client was told of is in the durable log, for the same lease.
//!
//! Conclusive only if the server restarted and granted again afterwards.

use std::collections::BTreeMap;

use fencelock_core::{Effect, LeaseId, Token};

use super::Verdict;
use crate::{event::EventKind, report::Report};

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-TOKENS");
    let live = live_grants(r);
    check_increasing(&mut v, &live);
    let durable = durable_grants(r);
    check_same(&mut v, &live, &durable);
    let acknowledged = check_acknowledged(&mut v, r, &durable);
    let (restarts, after) = restarts(r);
    v.evidence = vec![
        ("grants", live.len() as u64),
        ("acknowledged", acknowledged),
        ("restarts", restarts),
        ("grants_after_a_restart", after),
    ];
    v.require(restarts > 0 && after > 0, "no grant after a server restart");
    v
}

/// `(at_ms, lease, token)` of every live grant, in order.
fn live_grants(r: &Report) -> Vec<(u64, LeaseId, Token)> {
    let grants = r.events.iter().filter_map(|e| match e.kind {
        EventKind::Granted { lease, token, .. } => Some((e.at_ms, lease, token)),
        _ => None,
    });
    grants.collect()
}

fn durable_grants(r: &Report) -> Vec<(LeaseId, Token)> {
    let effects = r.replayed.iter().flat_map(|out| out.effects.iter());
    let grants = effects.filter_map(|e| match e {
        Effect::Granted { grant, .. } => Some((grant.lease, grant.token)),
        _ => None,
    });
    grants.collect()
}

fn check_increasing(v: &mut Verdict, live: &[(u64, LeaseId, Token)]) {
    for w in live.windows(2) {
        let ((_, _, a), (at, lease, b)) = (w[0], w[1]);
        if b <= a {
            v.violate(format!("at {at} ms token {b} was granted to lease {lease} after token {a}"));
        }
    }
}

fn check_same(v: &mut Verdict, live: &[(u64, LeaseId, Token)], durable: &[(LeaseId, Token)]) {
    let live_pairs: Vec<(LeaseId, Token)> = live.iter().map(|(_, l, t)| (*l, *t)).collect();
    if live_pairs == durable {
        return;
    }
    let i = live_pairs.iter().zip(durable).take_while(|(a, b)| a == b).count();
    v.violate(format!(
        "the durable log does not hold the grants that were made: they differ at grant #{i} (live {:?}, durable {:?}; {} live, {} durable)",
        live_pairs.get(i),
        durable.get(i),
        live_pairs.len(),
        durable.len()
    ));
}

/// Every grant a client held must be durable; returns how many were checked.
fn check_acknowledged(v: &mut Verdict, r: &Report, durable: &[(LeaseId, Token)]) -> u64 {
    let by_token: BTreeMap<Token, LeaseId> = durable.iter().map(|(l, t)| (*t, *l)).collect();
    let mut n = 0;
    for e in &r.events {
        let EventKind::Hold { client, lease, token, .. } = e.kind else {
            continue;
        };
        n += 1;
        if by_token.get(&token) != Some(&lease) {
            v.violate(format!(
                "at {} ms client-{client} holds token {token} for lease {lease}, a grant the durable log does not have",
                e.at_ms
            ));
        }
    }
    n
}

/// (restarts, grants made after the first restart).
fn restarts(r: &Report) -> (u64, u64) {
    let mut ups = 0u64;
    let mut after = 0u64;
    for e in &r.events {
        match e.kind {
            EventKind::ServerUp { .. } => ups += 1,
            EventKind::Granted { .. } if ups > 1 => after += 1,
            _ => {}
        }
    }
    (ups.saturating_sub(1), after)
}
