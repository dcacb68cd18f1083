//! Check C6, "acknowledged grants survive restarts" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).
//!
//! Rules where the reference leaves room:
//! * C6: the holder at a kill is the last grant completed before it, if its
//!   worker had not invoked the release of that cycle and had not seen the
//!   lease gone (a `skipped` write, or a read/write refused as `stale`) before
//!   the kill. A lost grant is reported at the first restart that loses it.
//!   The holder read back must carry that lease and token (in shared mode,
//!   one of the holders read back: readers hold together), unless the worker
//!   invoked its release between the kill and the read-back. A read-back that
//!   failed (`detail.read_error`: the node never answered it) is no evidence
//!   either way, and its restart is not judged.
//! * A lease lives through a restart only on what it has left: a fresh TTL
//!   once, then what it had at the kill (INV-12), counted from when the new
//!   server starts serving, and nobody can renew it while the harness holds
//!   the clients' traffic. So a restart is not judged where the grant's lease
//!   had less left at the kill, by its holder's own deadline (the worker
//!   records `detail.lease_left_ns` with each grant), than the time from the
//!   new server's start (`detail.started_at` of the restart note) to the
//!   read-back. The holder's deadline is the conservative one (its last
//!   renewal's send time plus the TTL): the server's is never earlier.

use std::collections::{HashMap, HashSet};

use super::run::{killed_at, without, Operation, Res, Run, Tally};
use super::{Check, Status};
use crate::history::{Event, Op};

const C6: &str = "acknowledged grants survive restarts";

/// C6: after each restart, the holder read back is the grant that was live
/// at the kill (see the module's rules).
pub(super) fn c6_grants_survive(r: &Run<'_>) -> Check {
    let restarts: Vec<&Event> = r.notes(Op::Restart).collect();
    if restarts.is_empty() {
        let why = "no restart with a holder read-back in this run".to_string();
        return without("C6", C6, Status::NotApplicable, why);
    }
    let index = CycleIndex::new(r);
    let (mut tally, mut evaluated) = (Tally::default(), 0);
    let mut lost: HashSet<(&str, u64)> = HashSet::new();
    for (i, restart) in restarts.iter().enumerate() {
        let kill = killed_at(restart);
        let next = restarts.get(i + 1).map_or(u64::MAX, |n| n.t);
        let Some(holder) = holder_after(r, restart, kill, next) else { continue };
        if holder.detail.get("read_error").is_some() {
            // The holder could not be read back: nothing to compare.
            continue;
        }
        let Some(h) = index.live_at(kill) else { continue };
        if lost.contains(&(h.p(), h.seq())) || index.release_invoked(&h, kill, holder.t) {
            continue;
        }
        if may_have_run_out(&h, restart, kill, holder) {
            continue;
        }
        evaluated += 1;
        if !read_back(r, holder, &h) {
            lost.insert((h.p(), h.seq()));
            tally.add(|| {
                format!(
                    "killed {}: {} held lease {:?}; read back at {}: lease {:?} token {:?}",
                    r.at(kill),
                    r.describe(&h),
                    h.lease(),
                    r.at(holder.t),
                    holder.lease,
                    holder.token
                )
            });
        }
    }
    if evaluated == 0 {
        let why = format!("{} restarts, none with a live holder at the kill and a holder read back", restarts.len());
        return without("C6", C6, Status::Inconclusive, why);
    }
    tally.judge("C6", C6, !r.info.fencing || !r.info.durable_tokens)
}

/// Whether `h`'s lease may have run out by the read-back `holder` with
/// nothing lost (see the module's rules): what it had left at the kill, by its
/// holder's deadline, is less than the time from the restart's start to the
/// read-back. Histories without either time are judged as before.
fn may_have_run_out(h: &Operation<'_>, restart: &Event, kill: u64, holder: &Event) -> bool {
    let (Some(deadline), Some(started)) = (h.lease_deadline(), restart.detail["started_at"].as_u64()) else {
        return false;
    };
    deadline.saturating_sub(kill) < holder.t.saturating_sub(started)
}

/// Whether the holder note `holder` shows the grant `h`: its lease and (with
/// fencing) its token, as the first holder or, where the note lists every
/// holder (`detail.holders`: readers of a shared lock), as any of them.
fn read_back(r: &Run<'_>, holder: &Event, h: &Operation<'_>) -> bool {
    let is_h = |lease: Option<u64>, token: Option<u64>| {
        lease == h.lease() && (!r.info.fencing || h.token().is_none() || token == h.token())
    };
    match holder.detail["holders"].as_array() {
        Some(all) if !all.is_empty() => all.iter().any(|x| is_h(x["lease"].as_u64(), x["token"].as_u64())),
        _ => is_h(holder.lease, holder.token),
    }
}

/// The first holder note after `restart` (and before the next restart) that
/// belongs to the kill at `kill`.
fn holder_after<'a>(r: &Run<'a>, restart: &Event, kill: u64, next: u64) -> Option<&'a Event> {
    r.notes(Op::Holder)
        .filter(|h| h.t >= restart.t && h.t < next)
        .find(|h| h.detail["killed_at"].as_u64().is_none_or(|k| k == kill))
}

/// Ok grants by completion time, and each worker cycle's operations.
struct CycleIndex<'a> {
    grants: Vec<Operation<'a>>,
    cycles: HashMap<(&'a str, u64), Vec<Operation<'a>>>,
}

impl<'a> CycleIndex<'a> {
    fn new(r: &Run<'a>) -> Self {
        let mut grants: Vec<Operation<'a>> = r.ops.iter().filter(|o| o.is_grant_ok()).copied().collect();
        grants.sort_by_key(|o| o.end());
        let mut cycles: HashMap<(&str, u64), Vec<Operation<'a>>> = HashMap::new();
        for o in &r.ops {
            cycles.entry((o.p(), o.seq())).or_default().push(*o);
        }
        CycleIndex { grants, cycles }
    }

    /// The last grant completed before `kill`, if its worker had neither
    /// invoked that cycle's release nor seen the lease gone by then.
    fn live_at(&self, kill: u64) -> Option<Operation<'a>> {
        let i = self.grants.partition_point(|o| o.end() < kill);
        let h = *self.grants.get(i.checked_sub(1)?)?;
        let cycle = self.cycles.get(&(h.p(), h.seq()))?;
        let ended = cycle
            .iter()
            .any(|o| (o.invoke.f.is_release() && o.start() < kill) || (o.saw_lease_gone() && o.end() < kill));
        (!ended).then_some(h)
    }

    /// Whether `h`'s worker invoked the cycle's release in `[from, to)`.
    ///
    /// The harness holds every client's traffic to the lock service from the
    /// kill until the holder has been read back, so a release invoked after
    /// the kill can only have taken effect if it was acknowledged before the
    /// read-back; only then is the changed holder excused.
    fn release_invoked(&self, h: &Operation<'_>, from: u64, to: u64) -> bool {
        self.cycles.get(&(h.p(), h.seq())).is_some_and(|c| {
            c.iter().any(|o| {
                o.invoke.f.is_release() && (from..to).contains(&o.start()) && o.res() == Res::Ok && o.end() < to
            })
        })
    }
}
