//! Resizing a semaphore, [`Command::Resize`]: the one way a lock's permits
//! change after its first acquirer set them.
//!
//! Where it sits: beside `lock.rs`, whose admission rule (`Lock::admits`,
//! INV-15) and queue (`grant_next`, INV-16) it reuses: a resize only moves the
//! number the rule compares with, then lets the queue move.

use super::{state::LockKind, Effects, Engine};
use crate::validate::check_resize;
use crate::*;
use std::sync::Arc;

impl Engine {
    /// [`Command::Resize`]: refused when `lock` is not a semaphore now or
    /// when fewer permits than needed would be left; otherwise the new number,
    /// and the queue granted from its head as far as the new number lets it.
    pub(super) fn resize(&mut self, lock: &str, permits: u32, fx: &mut Effects) -> Reply {
        let name = match check_resize(lock, permits) {
            Ok(name) => name,
            Err(e) => return Reply::Rejected(e),
        };
        let Some(l) = self.locks.get_mut(&name).map(Arc::make_mut) else {
            return Reply::Rejected(EngineError::NotASemaphore { lock: name.to_string() });
        };
        let LockKind::Semaphore { permits: was } = l.kind else {
            return Reply::Rejected(EngineError::NotASemaphore { lock: name.to_string() });
        };
        let largest_wait = l.queue.iter().map(|w| u64::from(w.weight)).max().unwrap_or(0);
        let needed = l.used().max(largest_wait);
        if u64::from(permits) < needed {
            return Reply::Rejected(EngineError::ResizeTooSmall { asked: permits, needed });
        }
        l.kind = LockKind::Semaphore { permits };
        if permits > was {
            self.grant_next(&name, fx);
            // Its waiters may all have left (their slot was done).
            self.drop_if_unused(&name);
        }
        Reply::Resized { was }
    }
}
