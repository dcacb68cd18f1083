//! INV-HEAL: after every fault ends, a new grant and an accepted act (a read,
//! a write or a permit use) happen
//! within 2 × TTL plus the restart slack (`SimConfig::heal_bound_ms`); and in
//! quiet time (no fault active, none ended within the bound) grants and accepted
//! acts never stop for longer than that bound, so a stall is reported where
//! it starts. Conclusive only if at least one fault happened.

use fencelock_core::Millis;

use super::Verdict;
use crate::{event::EventKind, report::Report};

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-HEAL");
    let bound = r.config.heal_bound_ms();
    let grants = instants(r, |k| matches!(k, EventKind::Granted { .. }));
    let writes = instants(r, |k| matches!(k, EventKind::Acted { accepted: true, .. }));
    let mut worst = 0;
    for f in &r.faults {
        let g = first_after(&grants, f.end);
        let w = first_after(&writes, f.end);
        let took = g.max(w).map_or(Millis::MAX, |t| t - f.end);
        worst = worst.max(took.min(r.end_ms()));
        if took > bound {
            let show = |t: Option<Millis>| t.map_or("none".to_string(), |t| format!("{t} ms"));
            v.violate(format!(
                "after `{}` ended at {} ms: first grant {}, first accepted act {} (bound {bound} ms)",
                f.what,
                f.end,
                show(g),
                show(w)
            ));
        }
    }
    for (what, at) in [("grant", &grants), ("accepted act", &writes)] {
        for (from, to) in quiet_stalls(r, at) {
            v.violate(format!("no {what} from {from} ms to {to} ms, with no fault active (bound {bound} ms)"));
        }
    }
    v.evidence = vec![("faults", r.faults.len() as u64), ("slowest_heal_ms", worst)];
    v.require(!r.faults.is_empty(), "no fault happened");
    v
}

fn instants(r: &Report, pick: impl Fn(&EventKind) -> bool) -> Vec<Millis> {
    let mut at: Vec<Millis> = r.events.iter().filter(|e| pick(&e.kind)).map(|e| e.at_ms).collect();
    at.sort_unstable();
    at
}

/// The first instant strictly after `t`.
fn first_after(sorted: &[Millis], t: Millis) -> Option<Millis> {
    let i = sorted.partition_point(|x| *x <= t);
    sorted.get(i).copied()
}

/// Stretches of quiet time longer than the bound without an instant of `at`.
fn quiet_stalls(r: &Report, at: &[Millis]) -> Vec<(Millis, Millis)> {
    let bound = r.config.heal_bound_ms();
    let mut stalls = Vec::new();
    for (q0, q1) in quiet_time(r) {
        let inside = at.iter().copied().filter(|t| (q0..q1).contains(t));
        let points: Vec<Millis> = std::iter::once(q0).chain(inside).chain(std::iter::once(q1)).collect();
        let long = points.windows(2).filter(|w| w[1] - w[0] > bound);
        stalls.extend(long.map(|w| (w[0], w[1])));
    }
    stalls
}

/// The intervals with no fault active and none ended within the bound before.
fn quiet_time(r: &Report) -> Vec<(Millis, Millis)> {
    let bound = r.config.heal_bound_ms();
    let mut quiet = Vec::new();
    let mut from = 0;
    for f in &r.faults {
        if f.start > from {
            quiet.push((from, f.start));
        }
        from = from.max(f.end + bound);
    }
    if r.end_ms() > from {
        quiet.push((from, r.end_ms()));
    }
    quiet
}
