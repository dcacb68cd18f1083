//! Reads served from this node's own applied state, without asking the
//! leader: what `consistency=local` on `GET /v1/locks` and `GET
//! /v1/locks/{name}` answers. The dashboard reads this way, so that it works
//! on every member of a group and costs the leader no quorum round trip.
//!
//! The state is the engine's as of the last entry this node applied. Its
//! times count in the group's clock: the `now` that the leader put into each
//! entry. A leader that serves reads its own clock, which is the group's; any
//! other node estimates it ([`GroupTime`]) as the `now` of the last entry it
//! applied plus the time its own monotonic clock says has passed since. So a
//! follower's TTLs and its state are late by its replication delay: right for
//! a dashboard, never for a decision, which asks the leader (the default,
//! `consistency=linearizable`).
//!
//! Where it sits: the state machine feeds [`GroupTime`] as it applies each
//! entry (`raft/state_machine.rs`); [`crate::api::Ops`] reads it for a local
//! read.

use std::sync::Mutex;

use fencelock_core::Millis;

/// A node's estimate of the group's clock: the engine's `now` when this node
/// first saw it, and its own clock then.
#[derive(Debug, Default)]
pub struct GroupTime {
    last: Mutex<Option<Sample>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    group: Millis,
    local: Millis,
}

impl GroupTime {
    /// The engine's clock reads `group` when this node's reads `local`. Only
    /// a new `group` reading is kept: the first sighting of one is the
    /// closest to when its entry was applied.
    pub fn observe(&self, group: Millis, local: Millis) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|s| s.group != group) {
            *last = Some(Sample { group, local });
        }
    }

    /// The group's clock when this node's reads `local`: the last sample
    /// moved on by the time passed here (none before the first sample).
    pub fn at(&self, local: Millis) -> Option<Millis> {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.map(|s| s.group.saturating_add(local.saturating_sub(s.local)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: the estimate moves on with this node's clock from the first
    /// sighting of an engine reading; a reading seen again later does not
    /// move the sample (that would make the group's clock run slow).
    #[test]
    fn the_group_clock_runs_on_from_the_first_sighting_of_each_reading() {
        let t = GroupTime::default();
        assert_eq!(t.at(100), None, "no estimate before the first entry");
        t.observe(5_000, 100);
        assert_eq!(t.at(100), Some(5_000));
        assert_eq!(t.at(350), Some(5_250));
        t.observe(5_000, 300);
        assert_eq!(t.at(350), Some(5_250), "the same reading seen later changes nothing");
        t.observe(5_400, 380);
        assert_eq!(t.at(400), Some(5_420));
        assert_eq!(t.at(0), Some(5_400), "a local reading before the sample never goes below it");
    }
}
