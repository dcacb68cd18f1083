//! Mutants: known bugs switched back on, so that the harness can show its
//! checkers catch them (`FENCELOCK_MUTANT=<comma list>`).
//!
//! - `memory-token`: the token counter behaves as if kept only in memory. Right
//!   before the state machine applies the first entry that was not in the log
//!   when the storage was opened (normally the new term's first entry after a
//!   restart), [`MemoryToken`] calls `fencelock_core::Engine::mutant_forget_tokens`:
//!   after a restart, tokens start again from 1 (INV-2 broken).
//! - `dead-waiter`: the engine loses its dead-waiter protection (etcd#11456): a
//!   release can hand the lock to a queued waiter whose lease has expired (INV-4
//!   broken); see `fencelock_core::mutants`, whose switch only this module turns.
//! - `wal-no-sync`: with the power-loss shim, the segment log's `sync_data` does
//!   nothing (see [`super::wal_undo`]): acknowledged entries are lost at a power loss.

use std::sync::atomic::{AtomicBool, Ordering};

use fencelock_core::Engine;
use fencelock_server::seams::Applying;

/// The mutant names `FENCELOCK_MUTANT` accepts.
pub const MUTANTS: [&str; 3] = ["memory-token", "dead-waiter", "wal-no-sync"];

/// The names of a `FENCELOCK_MUTANT` list, each checked against [`MUTANTS`].
pub fn parse(list: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(known) = MUTANTS.iter().find(|m| **m == name) else {
            return Err(format!("unknown mutant {name:?} (known: {})", MUTANTS.join(", ")));
        };
        if !out.contains(known) {
            out.push(*known);
        }
    }
    Ok(out)
}

/// Turns `dead-waiter` on if listed (it lives in the engine, process-wide).
pub fn switch_dead_waiter(list: &[&str]) {
    fencelock_core::mutants::set_dead_waiter_check_removed(list.contains(&"dead-waiter"));
}

/// The `memory-token` mutant: forgets the token counter once, before the first
/// entry that was not in the log at open.
#[derive(Debug, Default)]
pub struct MemoryToken {
    done: AtomicBool,
}

impl MemoryToken {
    pub fn before_apply(&self, entry: Applying, engine: &mut Engine) {
        if entry.index < entry.first_new || self.done.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(index = entry.index, "TEST-ONLY MUTANT memory-token: the token counter starts again from 1");
        engine.mutant_forget_tokens();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_accept_known_names_and_reject_unknown_ones() {
        assert_eq!(parse(" memory-token, dead-waiter ,memory-token,"), Ok(vec!["memory-token", "dead-waiter"]));
        assert_eq!(parse(""), Ok(vec![]));
        let err = parse("memory-token,dead-writer").unwrap_err();
        assert!(err.contains("unknown mutant \"dead-writer\""), "{err}");
    }
}
