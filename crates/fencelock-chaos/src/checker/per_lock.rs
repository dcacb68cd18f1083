//! Multi mode (atomic multi-locks, issue 18): the run seen one lock at a
//! time, for C3, C4 and C6.
//!
//! Lock `<lock>-m<i>` guards object `<object>-m<i>`. A worker's cycle takes
//! one of the locks (a plain acquire) or all of them (a multi grant: one
//! token per lock), and reads and writes each object it holds with that
//! lock's token. [`project`] keeps what concerns lock `i`: its grants and
//! releases (a multi grant's as a grant of that lock alone, with its token
//! for it), the reads and writes of its object, the object's final read and
//! audit entries, the lock's holders read back after a restart, and every
//! other note. A multi-holder's writes and a single holder's writes to one
//! object are then judged against each other by the checks as they are.

use fencelock_fence::storage::AuditEntry;

use super::c3_stale_accepts::c3_stale_accepts;
use super::c4_lost_updates::c4_lost_updates;
use super::c6_grants_survive::c6_grants_survive;
use super::run::Run;
use super::{merge, Check, RunInfo, Status, REDDEST};
use crate::history::{Event, Kind, Op};
use crate::scenario::multi_name;

/// C6's parts: a lock none of whose restarts could be judged (nobody held
/// it at the kills) does not make the run inconclusive when another's were.
const ANY_JUDGED: [Status; 5] =
    [Status::Fail, Status::Finding, Status::Pass, Status::Inconclusive, Status::NotApplicable];

/// C3, C4 and C6, each judged on every lock (and its object) alone; counts
/// summed, C3's and C4's status the reddest, C6's the reddest of the locks
/// whose restarts it could judge.
pub(super) fn per_lock(info: &RunInfo, history: &[Event], audit: &[AuditEntry]) -> (Check, Check, Check) {
    let (mut c3, mut c4, mut c6) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..info.multi {
        let (one, events) = project(info, history, i);
        let r = Run::new(&one, &events, audit);
        c3.push(c3_stale_accepts(&r));
        c4.push(c4_lost_updates(&r));
        c6.push(c6_grants_survive(&r));
    }
    (merge(c3, REDDEST), merge(c4, REDDEST), merge(c6, ANY_JUDGED))
}

/// The run as lock `i` and its object see it: an ordinary run of one lock.
pub(super) fn project(info: &RunInfo, history: &[Event], i: u32) -> (RunInfo, Vec<Event>) {
    let (lock, key) = (multi_name(&info.lock, i), multi_name(&info.object_key, i));
    let events = history.iter().filter_map(|e| on_lock(e, &lock, &key)).collect();
    (RunInfo { object_key: key, lock, multi: 0, ..info.clone() }, events)
}

/// `e` as lock `lock` and its object `key` see it, if it concerns them.
fn on_lock(e: &Event, lock: &str, key: &str) -> Option<Event> {
    let keep = match (e.kind, e.f) {
        (Kind::Note, Op::FinalRead) => e.target.as_deref() == Some(key),
        (Kind::Note, Op::Holder) => e.target.as_deref().is_none_or(|t| t == lock),
        (Kind::Note, _) => true,
        (_, Op::Read | Op::Write) => e.key.as_deref() == Some(key),
        (_, Op::Acquire | Op::Release) => return one_lock(e, lock),
        _ => false,
    };
    keep.then(|| e.clone())
}

/// A multi-mode acquire or release as one of `lock` alone, with its token
/// for that lock; none if it did not name `lock`.
fn one_lock(e: &Event, lock: &str) -> Option<Event> {
    let i = e.locks.as_ref()?.iter().position(|l| l == lock)?;
    let token = match &e.tokens {
        Some(all) => all.get(i).copied(),
        None => e.token,
    };
    Some(Event { token, tokens: None, locks: Some(vec![lock.to_string()]), ..e.clone() })
}
