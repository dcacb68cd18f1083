//! Check R2, "holders fit" (INV-15 at the server; read-write locks and
//! semaphores, issue 18; not in the reference): what the server itself says
//! holds the lock, polled with `describe` every 50 ms by the holder observer
//! (`holders` notes, see `observers::HolderPolls`).
//!
//! Rules, poll by poll:
//! * a lock that is not a semaphore (`permits` 0) has one exclusive holder
//!   (a writer) alone, or any number of shared holders (readers): a writer
//!   beside anyone is a violation;
//! * a semaphore of N permits never has more than N permits in use (the sum
//!   of its holders' weights).
//!
//! A poll that failed is not in the history: R2 judges only answers.

use super::run::{without, Run, Tally};
use super::{Check, Status};
use crate::history::Op;

const R2: &str = "holders fit (a writer alone, at most N permits)";

/// One holder of a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Polled {
    pub(super) exclusive: bool,
    pub(super) token: u64,
    pub(super) weight: u64,
}

/// R2: every poll of the lock's holders shows holders that fit together.
pub(super) fn r2_holders_fit(r: &Run<'_>) -> Check {
    let polls: Vec<_> = r.notes(Op::Holders).collect();
    if polls.is_empty() {
        return match r.info.polls_holders {
            true => without("R2", R2, Status::Inconclusive, "no poll of the lock's holders succeeded".into()),
            false => {
                let why = "no holder observer: the backend lists no holders (describe is fencelock's own)";
                without("R2", R2, Status::NotApplicable, why.into())
            }
        };
    }
    let mut tally = Tally::default();
    for e in polls {
        let permits = e.detail["permits"].as_u64().unwrap_or(0);
        let why = match polled(&e.detail) {
            Some(holders) => misfit(&holders, permits),
            None => Some(format!("a malformed poll: {}", e.detail)),
        };
        if let Some(why) = why {
            tally.add(|| format!("poll at {}: {why}", r.at(e.t)));
        }
    }
    tally.judge("R2", R2, false)
}

/// The holders of a `holders` note's detail; `None` if malformed.
pub(super) fn polled(detail: &serde_json::Value) -> Option<Vec<Polled>> {
    let one = |h: &serde_json::Value| {
        let exclusive = match h["mode"].as_str()? {
            "exclusive" => true,
            "shared" => false,
            _ => return None,
        };
        Some(Polled { exclusive, token: h["token"].as_u64()?, weight: h["weight"].as_u64().unwrap_or(1) })
    };
    detail["holders"].as_array()?.iter().map(one).collect()
}

/// Why `holders` cannot hold the lock together, if they cannot.
pub(super) fn misfit(holders: &[Polled], permits: u64) -> Option<String> {
    let tokens = || holders.iter().map(|h| h.token.to_string()).collect::<Vec<_>>().join(", ");
    if permits > 0 {
        let used: u64 = holders.iter().map(|h| h.weight).sum();
        return (used > permits).then(|| format!("{used} permits in use of {permits} (tokens {})", tokens()));
    }
    let writers = holders.iter().filter(|h| h.exclusive).count();
    (writers > 0 && holders.len() > 1)
        .then(|| format!("{writers} writer(s) among {} holders (tokens {})", holders.len(), tokens()))
}
