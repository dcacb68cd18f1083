//! Check E2, "an observer's terms never go back" (leader election, issue 17):
//! what each observer (`o0`, `o1`) received, in its receive order.
//!
//! Rules, event by event against the last one the observer received:
//! * `Leader(t)` only for a term above every term seen. (A leader of the
//!   current term with a new value would be a proclaim; the chaos workers
//!   never proclaim, so here it can only be an observer that invented a value,
//!   as the native observer did while watch events carried none.)
//! * `Vacant(t)` only for the current term while its leader is in office,
//!   or for a term above every term seen (a leader that came and went unseen);
//! * the first event after the observer subscribed again (its stream ended,
//!   see `Subscribed`) may also repeat the last event exactly: a new stream
//!   starts with the current leader. It may not go back either.
//! * An event out of order counts once; the next is judged against the last
//!   event that was in order.

use std::collections::BTreeMap;

use super::run::{without, Run, Tally};
use super::{Check, Status};
use crate::history::{Event, Op};

const E2: &str = "an observer's terms never go back";

/// One leader event as an observer received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen<'a> {
    Leader { term: u64, value: &'a [String] },
    Vacant { term: u64 },
}

impl<'a> Seen<'a> {
    /// The event of an `observed` note (`None` for a malformed one).
    pub(super) fn of(e: &'a Event) -> Option<Seen<'a>> {
        let term = e.token?;
        match e.what.as_deref()? {
            "leader" => Some(Seen::Leader { term, value: e.value.as_deref().unwrap_or_default() }),
            "vacant" => Some(Seen::Vacant { term }),
            _ => None,
        }
    }

    fn term(&self) -> u64 {
        match self {
            Seen::Leader { term, .. } | Seen::Vacant { term } => *term,
        }
    }
}

/// Whether `now` may follow `last` on one stream (`fresh`: `now` is the
/// first event of a new subscription).
fn may_follow(last: &Seen<'_>, now: &Seen<'_>, fresh: bool) -> bool {
    if now.term() > last.term() || (fresh && now == last) {
        return true;
    }
    match (last, now) {
        (Seen::Leader { term: lt, .. }, Seen::Vacant { term }) => term == lt,
        _ => false,
    }
}

/// E2: on every observer, each leader event may follow the one before it.
pub(super) fn e2_observer_terms(r: &Run<'_>) -> Check {
    let mut streams: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in r.notes.iter().filter(|e| matches!(e.f, Op::Observed | Op::Subscribed)) {
        streams.entry(e.p.as_str()).or_default().push(e);
    }
    if streams.is_empty() {
        return without("E2", E2, Status::NotApplicable, "no observer in this run".into());
    }
    if !streams.values().flatten().any(|e| e.f == Op::Observed) {
        return without("E2", E2, Status::Inconclusive, "the observers received no leader event".into());
    }
    let mut tally = Tally::default();
    for (p, events) in streams {
        check_stream(r, p, &events, &mut tally);
    }
    tally.judge("E2", E2, false)
}

fn check_stream(r: &Run<'_>, p: &str, events: &[&Event], tally: &mut Tally) {
    let (mut last, mut fresh): (Option<Seen<'_>>, bool) = (None, false);
    for e in events {
        if e.f == Op::Subscribed {
            fresh = true;
            continue;
        }
        let Some(now) = Seen::of(e) else {
            tally.add(|| format!("{p} at {}: a malformed leader event", r.at(e.t)));
            continue;
        };
        match last.as_ref().filter(|l| !may_follow(l, &now, fresh)) {
            // Judged against the last event that was in order, so that one
            // going back counts once and does not excuse the next.
            Some(before) => {
                tally.add(|| format!("{p} at {}: {now:?} after {before:?}{}", r.at(e.t), resubscribed(fresh)))
            }
            None => last = Some(now),
        }
        fresh = false;
    }
}

fn resubscribed(fresh: bool) -> &'static str {
    if fresh {
        " (first event after subscribing again)"
    } else {
        ""
    }
}
