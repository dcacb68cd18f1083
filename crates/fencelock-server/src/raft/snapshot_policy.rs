//! When this node takes a snapshot: once at least `snapshot_every` entries
//! were applied since the last one, and at least half as many as the state
//! holds records (leases, held locks, waiters), so that a snapshot writes at
//! most about two records per entry it replaces (issue 19 §4). Half, not all:
//! a state that gains a record with every entry would otherwise never catch
//! up; this way it is snapshotted each time it has grown by half.
//!
//! Where it sits: beside the Raft node, as a task of [`crate::serve`];
//! openraft's own policy is off (`SnapshotPolicy::Never`) and [`run`] asks it
//! for a snapshot (`trigger().snapshot()`, which openraft ignores while one is
//! being built). With a fixed count a node of a million leases wrote its
//! 416 MB state every 20,000 entries: 20 KB of snapshot per entry, and W3's
//! million creates wrote about 100 snapshots. A restart replays at most the
//! entries since the last snapshot, about half as many as the state's
//! records (a million entries apply in about 2 s, `tests/it/snapshot_scale.rs`).

use std::time::Duration;

use tokio::sync::watch;

use super::state_machine::SharedEngine;
use super::Raft;

/// How often [`run`] looks at the applied index.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Whether a snapshot is due after `applied_since` entries, with the state
/// holding `records`.
pub fn due(applied_since: u64, every: u64, records: u64) -> bool {
    applied_since >= every.max(records / 2).max(1)
}

/// The records of `engine`'s state that a snapshot writes; `None` while an
/// apply holds the engine (this task must not wait for it on a runtime
/// thread: it looks again in [`LOOK_EVERY`]) or if it cannot be read (the
/// apply that poisoned it stops the node anyway).
fn records(engine: &SharedEngine) -> Option<u64> {
    engine.try_read().ok().map(|e| e.stats()).map(|s| s.leases + s.held_locks + s.waiters)
}

/// Asks `raft` for a snapshot whenever one is [`due`], until `stop` turns true.
pub async fn run(raft: Raft, engine: SharedEngine, every: u64, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let (applied, snapshot) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.last_applied.map_or(0, |l| l.index), m.snapshot.map_or(0, |l| l.index))
        };
        let Some(records) = records(&engine) else { continue };
        if due(applied.saturating_sub(snapshot), every, records) {
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "snapshot not triggered: the Raft node has stopped");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::due;

    /// A small state snapshots every `every` entries; a large one waits for
    /// half as many entries as it holds records.
    #[test]
    fn a_snapshot_is_due_after_the_larger_of_the_count_and_half_the_state() {
        assert!(!due(49, 50, 10));
        assert!(due(50, 50, 10));
        assert!(!due(20_000, 20_000, 1_000_000));
        assert!(!due(499_999, 20_000, 1_000_000));
        assert!(due(500_000, 20_000, 1_000_000));
        assert!(!due(0, 0, 0), "never for nothing applied");
    }

    /// A state that gains a record with every entry is still snapshotted: by
    /// the time the log since the last snapshot is as long as the state was
    /// then, the state is half log.
    #[test]
    fn a_state_growing_with_every_entry_is_snapshotted_as_it_grows() {
        let (every, mut at, mut snapshots) = (100, 0u64, Vec::new());
        for index in 1..=100_000u64 {
            if due(index - at, every, index) {
                snapshots.push(index);
                at = index;
            }
        }
        assert_eq!(snapshots[0], 100);
        assert!(snapshots.windows(2).all(|w| w[1] - w[0] >= w[1] / 2), "{snapshots:?}");
        assert!(snapshots.len() >= 10 && *snapshots.last().unwrap() > 50_000, "{snapshots:?}");
    }
}
