//! [`Engine::restored`]: the state a group restored from a backup starts with.
//!
//! Where it sits: `fencelock snapshot restore` (server crate) builds a new data
//! dir from a backup taken with `fencelock snapshot save`. Between the backup and
//! the restore the old group may have issued more tokens and granted more locks,
//! so the restored group must not trust the backup's view of who holds what
//! (etcd's restore sent revisions backwards until it grew `--bump-revision`,
//! etcd#16028): every lease, hold and wait is dropped, lease ids are not reused,
//! and the token counter starts at the caller's floor when that is higher.

use super::Engine;

impl Engine {
    /// This engine as a restored group starts it: no leases, no locks, no
    /// queues; lease ids continue after this engine's; the next token is at
    /// least `next_token_at_least` (and never below this engine's next token).
    pub fn restored(&self, next_token_at_least: u64) -> Engine {
        Engine {
            now: self.now,
            next_lease_id: self.next_lease_id,
            next_token: self.next_token.max(next_token_at_least).max(1),
            ..Engine::default()
        }
    }

    /// The next token this engine would issue.
    pub fn next_token(&self) -> u64 {
        self.next_token
    }
}
