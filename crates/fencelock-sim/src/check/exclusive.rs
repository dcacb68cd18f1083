//! INV-EXCL, generalized to the design's INV-15 (holders fit): at any virtual
//! instant the grants clients believe they hold, within their own
//! conservative lease deadlines, fit together:
//! - on the lock [`LOCK`]: never a writer ([`Held::Exclusive`]) beside anyone,
//!   any number of readers ([`Held::Shared`]) together;
//! - on the semaphore [`SEMAPHORE`]: never more than [`PERMITS`] permits
//!   believed in use (the sum of the holders' weights);
//! - on each of [`MULTI_LOCKS`] (taken by multi-acquires, [`Held::Part`]):
//!   never two holders at once.
//!
//! A client's belief in a grant runs from when it learned of the grant to when
//! it sent the release or its deadline passed, whichever came first (the `Hold`
//! and `HoldEnd` events); a writer's downgrade (`Downgrading`, before the
//! request leaves) ends its exclusive belief and starts a shared one with the
//! same token. Beliefs of different clients that do not fit are a violation.
//! Conclusive only if the lock passed to another client after a holder's
//! deadline ran out (the case where two could believe at once), and, in a
//! [`Workload::Mixed`] run, if readers did share, a writer downgraded and a
//! semaphore had more than one permit in use.

use std::collections::BTreeMap;

use fencelock_core::{Millis, Token};

use super::Verdict;
use crate::{
    config::{Workload, LOCK, MULTI_LOCKS, PERMITS, SEMAPHORE},
    event::{EventKind, Held, HoldEnd},
    report::Report,
};

/// One client's belief that it holds `token` as `held`, over `[from, to)`.
#[derive(Debug, Clone, Copy)]
struct Belief {
    client: usize,
    token: Token,
    held: Held,
    from: Millis,
    to: Millis,
    expired: bool,
}

impl Belief {
    fn describe(&self) -> String {
        let Belief { client, token, held, from, to, .. } = self;
        format!("client-{client} believed it held token {token} ({held:?}) over [{from}, {to}) ms")
    }

    fn permits(&self) -> u32 {
        match self.held {
            Held::Permits(weight) => weight,
            _ => 0,
        }
    }
}

/// What the sweep saw, for the evidence.
#[derive(Debug, Default)]
struct Seen {
    /// A reader's belief began while another client's reader belief was on.
    shared_overlaps: u64,
    /// The most semaphore permits believed in use at once.
    max_permits: u32,
}

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-EXCL");
    let mut beliefs = beliefs(r);
    beliefs.sort_by_key(|b| (b.from, b.to, b.client));
    let seen = check_fit(&mut v, &beliefs);
    let handovers = handovers_after_expiry(&beliefs);
    let downgrades = r.events.iter().filter(|e| matches!(e.kind, EventKind::Downgrading { .. })).count() as u64;
    v.evidence = vec![
        ("beliefs", beliefs.len() as u64),
        ("ended_by_deadline", beliefs.iter().filter(|b| b.expired).count() as u64),
        ("handovers_after_expiry", handovers),
        ("shared_overlaps", seen.shared_overlaps),
        ("downgrades", downgrades),
        ("max_permits_in_use", u64::from(seen.max_permits)),
    ];
    v.require(handovers > 0, "the lock never passed to another client after a holder's deadline ran out");
    if r.config.workload == Workload::Mixed {
        v.require(seen.shared_overlaps > 0, "no two readers held the lock at once");
        v.require(downgrades > 0, "no writer downgraded");
        v.require(seen.max_permits > 1, "the semaphore never had more than one permit in use");
    }
    v
}

fn beliefs(r: &Report) -> Vec<Belief> {
    let mut open: BTreeMap<(usize, Token), (Millis, Held)> = BTreeMap::new();
    let mut done = Vec::new();
    let close = |client, token, held, from: Millis, to: Millis, expired| Belief {
        client,
        token,
        held,
        from,
        to: to.max(from),
        expired,
    };
    for e in &r.events {
        match e.kind {
            EventKind::Hold { client, token, held, .. } => {
                open.insert((client, token), (e.at_ms, held));
            }
            EventKind::Downgrading { client, token } => {
                if let Some((from, held)) = open.insert((client, token), (e.at_ms, Held::Shared)) {
                    done.push(close(client, token, held, from, e.at_ms, false));
                }
            }
            EventKind::HoldEnd { client, token, why } => {
                let (from, held) = open.remove(&(client, token)).unwrap_or((e.at_ms, Held::Exclusive));
                done.push(close(client, token, held, from, e.at_ms, why == HoldEnd::DeadlinePassed));
            }
            _ => {}
        }
    }
    // Beliefs still open when the run ended last until its end.
    let end = r.end_ms();
    done.extend(open.into_iter().map(|((client, token), (from, held))| close(client, token, held, from, end, false)));
    done
}

/// Sweep in start order, keeping the beliefs still on at each start.
fn check_fit(v: &mut Verdict, sorted: &[Belief]) -> Seen {
    let mut on: Vec<Belief> = Vec::new();
    let mut seen = Seen::default();
    for b in sorted.iter().filter(|b| b.from < b.to) {
        on.retain(|o| o.to > b.from);
        let others: Vec<&Belief> = on.iter().filter(|o| o.client != b.client).collect();
        match b.held {
            Held::Permits(weight) => {
                let used = weight + others.iter().map(|o| o.permits()).sum::<u32>();
                seen.max_permits = seen.max_permits.max(used);
                if used > PERMITS {
                    let holders: Vec<String> =
                        others.iter().filter(|o| o.permits() > 0).map(|o| o.describe()).collect();
                    v.violate(format!(
                        "{} permits of {SEMAPHORE} (of {PERMITS}) believed in use: {} beside {}",
                        used,
                        b.describe(),
                        holders.join(", ")
                    ));
                }
            }
            held => {
                let on_lock = others.iter().filter(|o| lock_of(o.held) == lock_of(held));
                for o in on_lock {
                    if held != Held::Shared || o.held != Held::Shared {
                        v.violate(format!(
                            "on {} a writer beside another holder: {} while {}",
                            lock_of(held),
                            o.describe(),
                            b.describe()
                        ));
                    } else {
                        seen.shared_overlaps += 1;
                    }
                }
            }
        }
        on.push(*b);
    }
    seen
}

/// The lock or semaphore a belief is on.
fn lock_of(held: Held) -> &'static str {
    match held {
        Held::Exclusive | Held::Shared => LOCK,
        Held::Permits(_) => SEMAPHORE,
        Held::Part(i) => MULTI_LOCKS[usize::from(i)],
    }
}

/// How often a belief that ended by its deadline was followed by another
/// client's belief.
fn handovers_after_expiry(sorted: &[Belief]) -> u64 {
    let pairs = sorted.windows(2);
    pairs.filter(|w| w[0].expired && w[1].client != w[0].client).count() as u64
}

#[cfg(test)]
mod tests {
    use fencelock_core::LeaseId;

    use super::*;
    use crate::{config::SimConfig, event::Event};

    /// A mixed run's report made of beliefs only: `(client, token, held,
    /// from, to)`, a downgrade at `from` when `held` is `None`.
    fn report(beliefs: &[(usize, u64, Option<Held>, Millis, Millis)]) -> Report {
        let mut events = Vec::new();
        for &(client, token, held, from, to) in beliefs {
            let token = Token(token);
            let kind = match held {
                Some(held) => EventKind::Hold { client, lease: LeaseId(client as u64), token, deadline: to, held },
                None => EventKind::Downgrading { client, token },
            };
            events.push(Event { at_ms: from, kind });
            if held.is_some() {
                events.push(Event { at_ms: to, kind: EventKind::HoldEnd { client, token, why: HoldEnd::Released } });
            }
        }
        events.sort_by_key(|e| e.at_ms);
        let cfg = SimConfig::new(1).with_workload(Workload::Mixed);
        Report::new(cfg, events, Vec::new(), Vec::new(), None)
    }

    /// INV-15: readers together hold; a writer beside a reader does not.
    #[test]
    fn a_writer_beside_a_reader_is_a_violation_readers_together_are_not() {
        let readers = report(&[(0, 1, Some(Held::Shared), 0, 50), (1, 2, Some(Held::Shared), 10, 60)]);
        let v = check(&readers);
        assert!(v.violations.is_empty(), "{}", v.summary());
        assert_eq!(v.evidence("shared_overlaps"), 1);
        let writer = report(&[(0, 1, Some(Held::Shared), 0, 50), (1, 2, Some(Held::Exclusive), 40, 60)]);
        let v = check(&writer);
        assert_eq!(v.violations.len(), 1, "{}", v.summary());
        assert!(v.violations[0].contains("a writer beside another holder"), "{}", v.summary());
    }

    /// A downgrade turns the writer's belief shared from that instant: a
    /// reader after it fits, one before it does not.
    #[test]
    fn a_downgraded_writer_is_a_reader_from_its_downgrade() {
        let after =
            report(&[(0, 5, Some(Held::Exclusive), 0, 100), (0, 5, None, 30, 0), (1, 6, Some(Held::Shared), 40, 90)]);
        assert!(check(&after).violations.is_empty(), "{}", check(&after).summary());
        let before =
            report(&[(0, 5, Some(Held::Exclusive), 0, 100), (0, 5, None, 50, 0), (1, 6, Some(Held::Shared), 40, 90)]);
        assert_eq!(check(&before).violations.len(), 1, "{}", check(&before).summary());
    }

    /// INV-15 for the semaphore: 3 permits in use hold, 4 do not.
    #[test]
    fn more_permits_than_the_semaphore_has_is_a_violation() {
        let three = report(&[(0, 1, Some(Held::Permits(2)), 0, 50), (1, 2, Some(Held::Permits(1)), 10, 60)]);
        let v = check(&three);
        assert!(v.violations.is_empty(), "{}", v.summary());
        assert_eq!(v.evidence("max_permits_in_use"), 3);
        let four = report(&[(0, 1, Some(Held::Permits(2)), 0, 50), (1, 2, Some(Held::Permits(2)), 10, 60)]);
        let v = check(&four);
        assert_eq!(v.violations.len(), 1, "{}", v.summary());
        assert!(v.violations[0].contains("4 permits of permits (of 3)"), "{}", v.summary());
    }

    /// INV-15 per lock for multi-acquires: two holders of the same
    /// multi-lock overlap is a violation; of different ones, or beside the
    /// main lock's writer, is not.
    #[test]
    fn two_holders_of_one_multi_lock_is_a_violation_of_two_locks_is_not() {
        let apart = report(&[
            (0, 1, Some(Held::Part(0)), 0, 50),
            (1, 2, Some(Held::Part(1)), 10, 60),
            (2, 3, Some(Held::Exclusive), 10, 60),
        ]);
        assert!(check(&apart).violations.is_empty(), "{}", check(&apart).summary());
        let same = report(&[(0, 1, Some(Held::Part(2)), 0, 50), (1, 2, Some(Held::Part(2)), 40, 60)]);
        let v = check(&same);
        assert_eq!(v.violations.len(), 1, "{}", v.summary());
        assert!(v.violations[0].contains("on multi-c a writer beside"), "{}", v.summary());
    }
}
