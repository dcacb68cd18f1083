//! Check S4, "exactly-once grants" (`docs/invariants.md` maps it to the
//! design's invariants and the simulator's).

use super::run::{without, Run, Tally};
use super::{Check, Stats, Status};

const S4: &str = "exactly-once grants";

/// S4: the server issued no more tokens than there were acquires that may
/// have been granted (a retried acquire granted twice issues two).
pub(super) fn s4_exactly_once(r: &Run<'_>, stats: &Stats) -> Check {
    let Some(issued) = stats.tokens_issued.filter(|_| r.info.fencing) else {
        return without("S4", S4, Status::NotApplicable, "no token counter from the server".into());
    };
    // A grant whose answer was lost used a token that no acquire returned,
    // once, without being a second grant, if it ended undelivered: released
    // when the server saw its call end, or with its lease, which the client
    // gave up (revoked, or let expire) after losing every answer. A retry
    // granted twice on a live lease ends none of these ways while the workers
    // run (revokes are counted before they stop), so it stays counted.
    let cancelled = stats.grants_cancelled.unwrap_or(0);
    let ended = stats.grants_expired.unwrap_or(0) + stats.grants_revoked.unwrap_or(0);
    let bound = stats.acquires.ok + stats.acquires.unknown + cancelled + ended;
    let mut tally = Tally::default();
    if issued > bound {
        let example = format!(
            "{issued} tokens issued for {} ok + {} unknown acquires + {cancelled} released undelivered + {ended} ended with their lease",
            stats.acquires.ok, stats.acquires.unknown
        );
        tally = Tally { violations: issued - bound, examples: vec![example] };
    }
    tally.judge("S4", S4, false)
}
