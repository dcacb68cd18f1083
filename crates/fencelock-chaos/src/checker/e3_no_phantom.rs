//! Check E3, "no phantom leader" (leader election, issue 17): every leader an
//! observer reports was elected by a campaign of the history.
//!
//! Rules: the term must have been won by a campaign of the history. Each
//! campaign publishes the value `<worker>-<seq>` (see `worker_process`), so a reported
//! leader with its value names its campaign: that campaign must exist, have
//! been invoked before the report, and, if it completed ok, have been elected
//! with the reported term; if it certainly failed, it elected nobody. A
//! leader reported without a value (the native backend's watch events carry
//! none: only the leader read when an observer subscribes has it, counted in
//! `Stats::leaders_without_value`) is judged by its term alone: some ok
//! campaign invoked before the report won it. A campaign the worker gave up on
//! (`unknown`) may have been granted before it withdrew, with a term nobody
//! recorded: a report naming it is allowed with any term, and a report
//! without a value whose term no campaign won is allowed if such a campaign
//! was invoked before it.

use std::collections::HashMap;

use super::e2_observer_terms::Seen;
use super::run::{without, Operation, Res, Run, Tally};
use super::{Check, Status};
use crate::history::{Event, Op};

const E3: &str = "no phantom leader";

/// E3: every observed leader was (or may have been) elected by the campaign it names.
pub(super) fn e3_no_phantom(r: &Run<'_>) -> Check {
    if r.notes(Op::Subscribed).next().is_none() {
        return without("E3", E3, Status::NotApplicable, "no observer in this run".into());
    }
    let leaders: Vec<(&Event, u64, &[String])> = r
        .notes(Op::Observed)
        .filter_map(|e| match Seen::of(e)? {
            Seen::Leader { term, value } => Some((e, term, value)),
            Seen::Vacant { .. } => None,
        })
        .collect();
    if leaders.is_empty() {
        return without("E3", E3, Status::Inconclusive, "the observers reported no leader".into());
    }
    let campaigns = Campaigns::new(r);
    let mut tally = Tally::default();
    for (e, term, value) in leaders {
        let why = match value.first().filter(|v| !v.is_empty()) {
            Some(v) => phantom(claimant(v).and_then(|k| campaigns.named.get(&k).copied()), e.t, term),
            None => campaigns.unwon(e.t, term),
        };
        if let Some(why) = why {
            tally.add(|| format!("{} at {}: leader of term {term} {value:?}: {why}", e.p, r.at(e.t)));
        }
    }
    tally.judge("E3", E3, false)
}

/// The history's campaigns, by the value they published and by the term they won.
struct Campaigns<'a> {
    named: HashMap<(&'a str, u64), &'a Operation<'a>>,
    /// Ok campaigns' terms, with their invoke times.
    won: HashMap<u64, u64>,
    /// Invoke times of the campaigns that may have been granted unrecorded.
    unknown: Vec<u64>,
}

impl<'a> Campaigns<'a> {
    fn new(r: &'a Run<'a>) -> Self {
        let all: Vec<&Operation<'_>> = r.ops.iter().filter(|o| o.invoke.f == Op::Campaign).collect();
        Campaigns {
            named: all.iter().map(|o| ((o.p(), o.seq()), *o)).collect(),
            won: all.iter().filter(|o| o.res() == Res::Ok).filter_map(|o| Some((o.token()?, o.start()))).collect(),
            unknown: all.iter().filter(|o| o.res() == Res::Unknown).map(|o| o.start()).collect(),
        }
    }

    /// Why a leader of `term`, reported at `t` without a value, cannot have been elected.
    fn unwon(&self, t: u64, term: u64) -> Option<String> {
        match self.won.get(&term) {
            Some(&start) if start <= t => None,
            Some(_) => Some("reported before the campaign that won the term began".into()),
            None if self.unknown.iter().any(|&s| s <= t) => None,
            None => Some("no campaign won this term".into()),
        }
    }
}

/// Why a leader of `term` reported at `t` by an observer cannot have been
/// elected by `campaign`, the campaign its value names (if any).
fn phantom(campaign: Option<&Operation<'_>>, t: u64, term: u64) -> Option<String> {
    let Some(c) = campaign else { return Some("no campaign published this value".into()) };
    if t < c.start() {
        return Some(format!("reported before its campaign began (+{} ms)", (c.start() - t) / super::NS_PER_MS));
    }
    match c.res() {
        Res::Ok if c.token() != Some(term) => Some(format!("its campaign was elected with term {:?}", c.token())),
        Res::Fail => Some("its campaign certainly failed".into()),
        _ => None,
    }
}

/// The campaign a leader's value names: `w2-17` → `("w2", 17)`.
fn claimant(value: &str) -> Option<(&str, u64)> {
    let (p, seq) = value.rsplit_once('-')?;
    Some((p, seq.parse().ok()?))
}
