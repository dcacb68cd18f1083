//! Engine unit tests: one input at a time, asserting the exact [`Output`].
//!
//! Invariants cited by these tests (the numbering is the one of `docs/design.md`):
//! - INV-1 at most one live holder per exclusive lock.
//! - INV-2 tokens strictly increase across all grants of all locks, never reused,
//!   never 0.
//! - INV-3 FIFO: among live waiters of a lock, grants follow queue order.
//! - INV-4 no grant to an expired (or revoked) lease; a waiter whose lease ended is
//!   dropped.
//! - INV-5 release is compare-and-delete: a wrong (lock, lease, token) changes
//!   nothing.
//! - INV-6 a retried request (same lease, same req) never grants twice and gets the
//!   first outcome.
//! - INV-7 lock-delay: after an unclean loss (expiry) the lock stays closed for
//!   lock_delay; after release/revoke it does not.
//! - INV-8 a lease expires only when its deadline (now + ttl since last
//!   keep-alive) has passed; LeaderStart gives every lease a full fresh TTL.
//! - INV-9 every invalid input is rejected with an error and changes nothing.
//! - INV-13 a lease granted by an identity takes commands only from it (and a
//!   revoke from an admin).
//! - INV-15 the holders of a lock fit together: many shared holders or one
//!   exclusive one; at most N permits of a semaphore.
//! - INV-16 FIFO across modes and weights: nobody is granted past a live waiter.
//! - INV-17 hold-at-least: however a grant made with it ends, its lock stays
//!   closed until that long after the grant (engine time; a new leader keeps
//!   the grant's age and restarts a closure in full, never shortening it).
//! - INV-18 never a partial multi-lock: all of a multi-acquire's grants are
//!   made in one step, or none.

use super::*;

mod consistency_tests;
mod floor_tests;
mod harness;
mod hold_tests;
mod identity_tests;
mod lease_tests;
mod lock_tests;
mod misc_tests;
mod multi_tests;
mod owner_tests;
mod policy_tests;
mod report_tests;
mod resize_tests;
mod shared_tests;
mod slot_tests;
